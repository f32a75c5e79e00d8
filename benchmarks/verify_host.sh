#!/bin/bash
# What a verify step costs on a GPU machine, host and device apart, in one call: the steady
# decode and verify steps' kernels and the host's functions at 1 and 16 lanes
# (verify_cost.py --profile, every draft right; its table gives each pass's card time beside
# the step's wall time), K=7 at 1 and 16 lanes, drafting that cannot win against the
# overlapped plain engine (gate_cost.py), and the GPU drafting tests (drafted = plain for every
# drafter at 1-64 lanes). The limits hold on a cold machine, where compiling and the tile
# book's timings take several times a warm run's (a 16-lane verify_cost run took 42 s warm and
# passed 110 s cold; the drafting tests 163 s warm and past 360 s cold).
#
#   bash benchmarks/verify_host.sh OUT [phases]
#
# phases, in the order given: profile, k7 (one stream, profiled), k716 (16 lanes of 8 rows:
# one 128-row piece a product), gate, tests, invariants (the 9B shape's concurrent = solo,
# decode = prompt, chunk seams and graph = eager), registry (the conv and recurrence kernels' checks,
# a state left in another slot among them, with their planted controls), demo (the bundled
# demo plain against drafted at ngram:4, mtp:4 and mtp:7, demo_drafting.py), host (a
# sequential step's host time by part, step_profile.py; an n-gram lane that drafts nothing
# against engines of the same work, lookup_cost.py), step (host's step profile alone), lookup
# (lookup_cost.py alone), base
# (the same on the tree at $BASE, default HEAD~1, in the same call), lanes
# (tests/test_gpu_lanes.py: concurrent = solo and overlapped = sequential at 64 and 256
# lanes), ops (host_ops.py: what the host's primitives around a replay cost on this machine)
# (default: the first four). Settings: MODELS (default 4bit);
# HOST_LANES (the step profiles' lane counts, default 1); BUDGET (seconds: a phase is skipped
# when less than its usual warm time is left of it, and cut at what is left).
set -u
OUT=${1:?usage: verify_host.sh OUT [phases]}
PHASES=${2:-profile k7 gate tests}
TAIL=${TAIL:-60}
BUDGET=${BUDGET:-100000}
source "$(dirname "$0")/serve_lib.sh"  # phase, card_start
card_start || exit 1

# within NEED LIMIT NAME CMD...: phase NAME under LIMIT or what is left of BUDGET, if NEED is left
within() {
    local need=$1 limit=$2 left=$((BUDGET - SECONDS))
    shift 2
    if [ "$left" -lt "$need" ]; then echo "=== $1 skipped: $left s of the budget left"; return; fi
    local name=$1
    shift
    phase "$name" $((limit < left ? limit : left)) "$@"
}

# the random checkpoint written once (its index is written last) and read by every phase after
M=${MODELS:-4bit}
again() { verify_checkpoint "$M"; }
V="$py benchmarks/verify_cost.py --out /tmp/verify --models $M"
# a sequential step's host time by part (host, step; base on the tree before)
STEP=(benchmarks/step_profile.py --models "$M" --lanes "${HOST_LANES:-1}" --no-overlap --steps 48)
# an n-gram lane that drafts nothing against engines of the same work (host, lookup)
LOOKUP=(benchmarks/lookup_cost.py --device cuda --rounds 100 --variants)

for p in $PHASES; do
    case $p in
        profile) within 60 300 profile $V $(again) --lanes 1,16 --draft-tokens 4 --profile ;;
        k7)      TAIL=8 within 60 150 k7 $V $(again) --lanes 1 --draft-tokens 7 --profile ;;
        k716)    TAIL=6 within 40 150 k716 $V $(again) --lanes 16 --draft-tokens 7 ;;
        gate)    TAIL=8 within 60 240 gate $py benchmarks/gate_cost.py --models "$M" \
                     --lanes 1,16 --draft-tokens 4 --tokens 256 ;;
        tests)   TAIL=8 within 240 450 tests $py -m pytest -q -x tests/test_gpu_drafting.py ;;
        invariants) TAIL=8 within 100 300 invariants $py -m pytest -q tests/test_gpu.py -k \
                     "concurrent_equals_solo_9b or decode_equals_prefill or chunk_invariant or cuda_graph_decode" ;;
        registry) for k in conv gdn.recurrence; do
                     TAIL=8 within 60 240 "registry-$k" $py -m tensorfold.checks.registry --only "$k"
                 done ;;
        demo)    TAIL=16 within 60 300 demo $py benchmarks/demo_drafting.py --device cuda \
                     --tasks 12 --rounds 3 --drafts ngram:4,mtp:4,mtp:7 ;;
        host)    TAIL=6 within 60 200 host-step $py "${STEP[@]}"
                 TAIL=12 within 40 150 host-lookup $py "${LOOKUP[@]}" \
                     plain,closed,ngram,bare,plain2,closed2,ngram2,bare2 ;;
        step)    TAIL=6 within 60 200 host-step $py "${STEP[@]}" ;;
        lookup)  TAIL=12 within 40 150 host-lookup $py "${LOOKUP[@]}" plain,closed,ngram,plain2,closed2,ngram2 ;;
        lanes)   TAIL=8 within 240 450 lanes $py -m pytest -q -x tests/test_gpu_lanes.py ;;
        ops)     TAIL=40 within 20 90 ops $py benchmarks/host_ops.py --reps 1000 ;;
        base)    base_tree "${BASE:-HEAD~1}" /tmp/base || continue
                 (export PYTHONPATH=${PYTHONPATH/src:tests:benchmarks//tmp/base/src:/tmp/base/tests:/tmp/base/benchmarks}
                  TAIL=6 within 60 200 host-base $py /tmp/base/"${STEP[0]}" "${STEP[@]:1}") ;;
    esac
done
cat "$OUT/phases.txt" 2>/dev/null
