#!/bin/bash
# The grid form of the gated delta rule (--gdn-form grid: the chunk form in one launch a layer)
# on a GPU machine in one call: the registry's GDN entries with their planted controls, the
# layer tests in both chunk forms (cuts, decode, graph = eager, lanes, float64), one 9B layer in
# each form and launch variant (benchmarks/gdn_forms.py), the 9B invariants with the grid form as
# the engine's (tests/test_gpu.py), and whole-model prompts and decode in the recurrence and grid
# forms (h200.py), in one process each on the same card.
#
#   bash benchmarks/grid.sh OUT [phases]
#
# phases, in the order given: probe, sweep, registry, compare, layer-tests, layer, tests, model,
# profile (default: registry to model). probe: the kernel's parts, one launch a process, to find
# a fault; sweep: launch configurations and the mma.sync path, run, timed and checked side by
# side; compare: the recurrence beside the grid kernel on one 9B layer; profile: where an 8k
# prompt's kernel time goes in each form, 4-bit.
# Settings: MODELS (default bf16,4bit), SIZES (default 2048,8192), LANES (default 1,4); FORM
# (the engine's form in tests, default grid; rows for the rows form), TESTS_K (their -k), FORMS_K
# (the layer tests' -k: which forms), ONLY (the registry's entries, default gdn.).
set -u
OUT=${1:?usage: grid.sh OUT [phases]}
PHASES=${2:-registry compare layer-tests layer tests model}
TAIL=${TAIL:-16}
source "$(dirname "$0")/serve_lib.sh"  # phase, card_start
card_start || exit 1

for p in $PHASES; do
    case $p in
        probe)       for args in "blocks 8" "blocks 8 np" "inverse 8" "inverse 8 np" \
                                 "kernel 2 4 16 1 16 4 float16" "kernel 2 4 16 1 16 4 float16 np" \
                                 "kernel 16 32 128 70 32 8 bfloat16" \
                                 "kernel 16 32 128 70 32 8 bfloat16 np"; do
                         CUDA_LAUNCH_BLOCKING=1 timeout 90 $py benchmarks/grid_probe.py $args 2>&1 \
                             | grep -E "warps|Error" | head -2 | sed "s/^/[$args] /"
                     done ;;
        sweep)       # launch configurations side by side (one process each): run + time, then the
                     # registry's gdn.grid entry; "v2" runs compile every product for mma.sync
                     for args in "kernel 16 32 128 70 64 8" "kernel 16 32 128 70 64 4" \
                                 "kernel 16 32 128 70 16 8" "kernel 16 32 128 70 16 4" \
                                 "v2 kernel 16 32 128 70 32 8" "v2 kernel 16 32 128 70 64 8" \
                                 "registry 64 8" "v2 registry 32 8"; do
                         set -- $args; env=""
                         [ "$1" = v2 ] && { env="DISABLE_MMA_V3=1"; shift; }
                         [ "$1" = kernel ] && set -- "$@" bfloat16
                         (env $env timeout 200 $py benchmarks/grid_probe.py "$@" 2>&1 \
                             | grep -E "ran|timing|registry|Error" | head -3 | sed "s/^/[$args] /") &
                     done; wait ;;
        compare)     phase compare 150 $py benchmarks/grid_probe.py compare ;;
        registry)    phase registry 240 $py -m tensorfold.checks.registry --only "${ONLY:-gdn.}" ;;
        layer-tests) phase layer-tests 150 $py -m pytest -q -x tests/test_gpu_gdn_chunk.py \
                         -k "${FORMS_K:-chunk or grid or rows}" ;;
        layer)       TAIL=30 phase layer 240 $py benchmarks/gdn_forms.py --shape 9b ;;
        tests)       phase tests 300 $py -m pytest -q -x tests/test_gpu.py --gdn-form "${FORM:-grid}" \
                         --gpu-format 4bit -k "${TESTS_K:-not registry}" ;;
        model)       for form in recurrence grid; do
                         phase "model-$form" 240 $py benchmarks/h200.py --out /tmp/bench \
                             --gdn-form $form --models "${MODELS:-bf16,4bit}" \
                             --lanes "${LANES:-1,4}" --sizes "${SIZES:-2048,8192}" --in-memory
                     done ;;
        profile)     for form in recurrence grid; do
                         TAIL=12 phase "profile-$form" 200 $py benchmarks/profile_decode.py \
                             --models 4bit --lanes 1 --prompt 8192 --in-memory --gdn-form $form
                     done ;;
    esac
done
