#!/bin/bash
# Drafting's gate and the grouped expert products on a GPU machine, in one go: the GPU drafting
# and MoE tests and the registry's product and MoE entries (every launch shape the tile book may
# pick against the default's bits, with planted faults), what drafting costs when it cannot win
# (gate_cost.py), a verify pass against a decode step with every draft right (verify_cost.py,
# K = 4 and 7), the 35B-A3B's decode at 1/16/64 lanes and the 9B's at 16/64/256 lanes with the
# tile book free to pick the new launch shapes (h200.py); a table of each is printed last.
#
#   bash benchmarks/gates_and_experts.sh OUT [phases]
#
# phases, in the order given: tests, registry, gate, verify, moe, lanes (default: all).
# Settings: GATE_LANES, VERIFY_LANES, MOE_LANES, LANES.
set -u
OUT=${1:?usage: gates_and_experts.sh OUT [phases]}
PHASES=${2:-tests registry gate verify moe lanes}
TAIL=${TAIL:-16}
source "$(dirname "$0")/serve_lib.sh"  # phase, card_start
card_start || exit 1

for p in $PHASES; do
    case $p in
        tests)    phase tests 420 $py -m pytest -q -x tests/test_gpu_drafting.py tests/test_gpu_moe.py ;;
        registry) phase registry-moe 240 $py -m tensorfold.checks.registry --only moe.
                  phase registry-affine 300 $py -m tensorfold.checks.registry --only linear.affine ;;
        gate)     phase gate 240 $py benchmarks/gate_cost.py --out /tmp/gate --models 4bit \
                      --lanes "${GATE_LANES:-1,16}" --draft-tokens 4 --tokens 256 ;;
        verify)   for k in 4 7; do
                      phase "verify-k$k" 240 $py benchmarks/verify_cost.py --out /tmp/verify \
                          --checkpoint /tmp/gate/4bit --models 4bit --lanes "${VERIFY_LANES:-1,16}" \
                          --draft-tokens "$k"
                  done ;;
        moe)      phase moe 300 $py benchmarks/h200.py --out /tmp/bench --shape 35b-a3b --models 4bit \
                      --sizes 8192 --lanes "${MOE_LANES:-1,16,64}" --in-memory ;;
        lanes)    phase lanes 300 $py benchmarks/h200.py --out /tmp/bench --models 4bit \
                      --lanes "${LANES:-16,64,256}" --sizes "" --in-memory ;;
    esac
done
