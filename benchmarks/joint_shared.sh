#!/bin/bash
# The MoE shared expert as a ninth choice of the grouped launches, on a GPU machine in one call:
# the MoE registry entries (the tile table at 9 choices among them), the card test comparing the
# joint form with the shared expert's own launches bitwise (and the file's other MoE tests), then
# the 35B-A3B decode sweep with its own launches (h200.py --own-shared) and joined, one process
# each on the same card, the two tables last.
#
#   bash benchmarks/joint_shared.sh OUT [phases]
#
# phases: registry, tests, lanes (default: all). Settings: LANES (default 1,16,64), SHAPE
# (default 35b-a3b), SIZES (prompt lengths timed beside, default none).
set -u
OUT=${1:?usage: joint_shared.sh OUT [phases]}
PHASES=${2:-registry tests lanes}
TAIL=${TAIL:-14}
source "$(dirname "$0")/serve_lib.sh"  # phase, ways, card_start
card_start || exit 1

for p in $PHASES; do
    case $p in
        registry) phase registry 300 $py -m tensorfold.checks.registry --only moe. ;;
        tests)    phase tests 330 $py -m pytest -q -x tests/test_gpu_moe.py -k "joint or decode_equals" ;;
        lanes)    TAIL=9 ways lanes 200 "--own-shared -" $py benchmarks/h200.py --out /tmp/bench \
                      --shape "${SHAPE:-35b-a3b}" --models 4bit --lanes "${LANES:-1,16,64}" \
                      --sizes "${SIZES:-}" --in-memory ;;
    esac
done
