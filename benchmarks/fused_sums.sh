#!/bin/bash
# Segment sums added inside the ops that read the products, on a GPU machine in one call: the
# registry entry with its planted controls, the 9B decode tests at 4 bits (decode = prefill,
# graph = eager), and the lane sweep with the sums fused and then in their own launches
# (h200.py --unfused-sums: the same bits), in one process each on the same card.
#
#   bash benchmarks/fused_sums.sh OUT [phases]
#
# phases: registry, tests, lanes (default: all). Settings: LANES (default 1,16,64), MODELS (4bit).
set -u
OUT=${1:?usage: fused_sums.sh OUT [phases]}
PHASES=${2:-registry tests lanes}
TAIL=${TAIL:-14}
source "$(dirname "$0")/serve_lib.sh"  # phase, ways, card_start
card_start || exit 1

for p in $PHASES; do
    case $p in
        registry) phase registry 90 $py -m tensorfold.checks.registry --only fused. ;;
        tests)    phase tests 150 $py -m pytest -q -x tests/test_gpu.py --gpu-format 4bit \
                      -k "decode_equals or cuda_graph" ;;
        lanes)    ways lanes 150 "- --unfused-sums" $py benchmarks/h200.py --out /tmp/bench \
                      --models "${MODELS:-4bit}" --lanes "${LANES:-1,16,64}" --sizes "" --in-memory ;;
    esac
done
