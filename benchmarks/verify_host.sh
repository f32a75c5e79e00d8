#!/bin/bash
# What a verify step costs on a GPU machine, host and device apart, in one call: the steady
# decode and verify steps' kernels and the host's functions at 1 and 16 lanes
# (verify_cost.py --profile, every draft right), one stream at K=7, drafting that cannot win
# against the overlapped plain engine (gate_cost.py), and the GPU drafting tests
# (drafted = plain for every drafter at 1-64 lanes). The limits hold on a cold machine, where
# compiling and the tile book's timings take several times a warm run's (a 16-lane verify_cost
# run took 42 s warm and passed 110 s cold).
#
#   bash benchmarks/verify_host.sh OUT [phases]
#
# phases, in the order given: profile, k7, gate, tests, registry (the conv and recurrence
# kernels' checks, a state left in another slot among them, with their planted controls), demo
# (the bundled demo plain against drafted, demo_drafting.py) (default: the first four; "profile
# k7" and then "gate tests" each fit a call of 10 minutes). Settings: MODELS (default 4bit).
set -u
OUT=${1:?usage: verify_host.sh OUT [phases]}
PHASES=${2:-profile k7 gate tests}
TAIL=${TAIL:-60}
source "$(dirname "$0")/serve_lib.sh"  # phase, card_start
card_start || exit 1

for p in $PHASES; do
    case $p in
        profile) phase profile 300 $py benchmarks/verify_cost.py --out /tmp/verify \
                     --models "${MODELS:-4bit}" --lanes 1,16 --draft-tokens 4 --profile ;;
        k7)      TAIL=6 phase k7 150 $py benchmarks/verify_cost.py --out /tmp/verify \
                     --models "${MODELS:-4bit}" --lanes 1 --draft-tokens 7 ;;
        gate)    TAIL=8 phase gate 240 $py benchmarks/gate_cost.py --models "${MODELS:-4bit}" \
                     --lanes 1,16 --draft-tokens 4 --tokens 256 ;;
        tests)   TAIL=8 phase tests 360 $py -m pytest -q -x tests/test_gpu_drafting.py ;;
        registry) for k in conv gdn.recurrence; do
                     TAIL=8 phase "registry-$k" 240 $py -m tensorfold.checks.registry --only "$k"
                 done ;;
        demo)    TAIL=16 phase demo 300 $py benchmarks/demo_drafting.py --device cuda --tasks 12 \
                     --rounds 2 ;;
    esac
done
