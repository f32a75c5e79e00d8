#!/bin/bash
# Fewer launches a decode step, checked and timed on a GPU machine in one call: the changed
# kernels' registry entries (with their bitwise one-launch = two-launch cases and planted
# controls), the 9B's exactness tests, the lane sweep and a step's launches against the tree at
# $BASE (default HEAD~1) on the same card, and the GPU drafting tests (verify passes run the
# one-launch forms with their write slots).
#
#   BASE=<commit> bash benchmarks/launches.sh OUT [phases]
#
# phases, in the order given: registry, norms (the residual add + norm's launch by warp count,
# norm_warps.py), tests, lanes, pdl (the sweep with dependent launch on and off; moe: the same
# at the 35B-A3B shape; probe: pdl_probe.py, its capture, upload and tile book costs), profile,
# drafting, moetests (tests/test_gpu_moe.py) (default: all but pdl, moe, probe and moetests).
# Settings: MODELS (default 4bit), LANES (default 1,16,64).
set -u
OUT=${1:?usage: launches.sh OUT [phases]}
PHASES=${2:-registry norms tests lanes profile drafting}
TAIL=${TAIL:-12}
source "$(dirname "$0")/serve_lib.sh"  # phase, card_start, base_tree
card_start || exit 1
base_tree "${BASE:-HEAD~1}" /tmp/base || exit 1
old=${PYTHONPATH/src:tests:benchmarks//tmp/base/src:/tmp/base/tests:/tmp/base/benchmarks}
sweep=(benchmarks/h200.py --out /tmp/bench --models "${MODELS:-4bit}" --lanes "${LANES:-1,16,64}"
       --sizes "" --in-memory)

for p in $PHASES; do
    case $p in
        registry) for k in conv gdn.recurrence gates+silu norm.rms+gated fused.readers; do
                      phase "registry-$k" 150 $py -m tensorfold.checks.registry --only "$k"
                  done ;;
        norms)    phase norms 120 $py benchmarks/norm_warps.py --warps 4,8,16,32 ;;
        tests)    phase tests 300 $py -m pytest -q -x tests/test_gpu.py -k \
                      "concurrent_equals_solo_9b or decode_equals_prefill or cuda_graph_decode" ;;
        lanes)    (phase lanes-new 200 $py "${sweep[@]}")
                  # the base tree's own script: a newer one may import what the old tree lacks
                  (export PYTHONPATH=$old; phase lanes-old 200 $py /tmp/base/"${sweep[0]}" \
                      "${sweep[@]:1}") ;;
        pdl)      for on in 0 1; do  # dependent launch off, then on, the same tree and card
                      (export TENSORFOLD_PDL=$on; phase "lanes-pdl$on" 200 $py "${sweep[@]}")
                  done ;;
        probe)    phase pdl-probe 200 $py benchmarks/pdl_probe.py ;;
        moe)      for on in 0 1; do  # the 35B-A3B's sweep, dependent launch off, then on
                      (export TENSORFOLD_PDL=$on; phase "moe-pdl$on" 250 $py "${sweep[@]}" \
                          --shape 35b-a3b)
                  done ;;
        profile)  TAIL=40 phase profile 200 $py benchmarks/profile_decode.py --out /tmp/prof \
                      --in-memory --models "${MODELS:-4bit}" --lanes 1 ;;
        drafting) phase drafting 300 $py -m pytest -q -x tests/test_gpu_drafting.py ;;
        moetests) phase moe-tests 300 $py -m pytest -q -x tests/test_gpu_moe.py ;;
    esac
done
