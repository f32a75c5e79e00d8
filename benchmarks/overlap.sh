#!/bin/bash
# The engine's overlapped passes on a GPU machine, in one go: the GPU tests that run them (the
# overlapped engine against the sequential one at 64 lanes, graphs and rules; the graph and
# concurrent = solo tests, whose watched lanes take sequential steps), the lane sweep with and
# without overlap (h200.py --overlap / --no-overlap), and where a step's time goes in each
# (step_profile.py); the segment sums' registry entry (fused.segment_sums, with its controls);
# and what drafting that cannot win costs against the overlapped plain engine (gate_cost.py).
#
#   bash benchmarks/overlap.sh OUT [phases]
#
# phases, in the order given: tests, lanes, profile, registry, drafting (default: the first
# three). Settings: LANES (default 1,16,64), MODELS (default 4bit), PROFILE_LANES (default 64).
set -u
OUT=${1:?usage: overlap.sh OUT [phases]}
PHASES=${2:-tests lanes profile}
TAIL=${TAIL:-16}
source "$(dirname "$0")/serve_lib.sh"  # phase, ways, card_start
card_start || exit 1

for p in $PHASES; do
    case $p in
        tests)   phase tests 300 $py -m pytest -q -x tests/test_gpu_lanes.py \
                     -k "overlapped or padded_graph or many_lanes and 64" ;;
        lanes)   ways lanes 200 "--overlap --no-overlap" $py benchmarks/h200.py --out /tmp/bench \
                     --models "${MODELS:-4bit}" --lanes "${LANES:-1,16,64}" --sizes "" --in-memory ;;
        registry) phase registry 90 $py -m tensorfold.checks.registry --only fused. ;;
        drafting) phase drafting 240 $py benchmarks/gate_cost.py --models "${MODELS:-4bit}" \
                      --lanes 1,16 --draft-tokens 4 --tokens 256 ;;
        profile) for how in --overlap --no-overlap; do
                     phase "profile$how" 150 $py benchmarks/step_profile.py $how \
                         --models "${MODELS:-4bit}" --lanes "${PROFILE_LANES:-64}"
                 done ;;
    esac
done
