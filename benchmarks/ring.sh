#!/bin/bash
# The Gluon products' inputs ring on a GPU machine, in one go: its registry entries with their
# planted controls (its bits against the Triton kernels', rows 1 to 64, 4 and 8 warps), every
# launch shape of the 16- and 64-row products timed with the untried ones beside them
# (kernels.py --untried, each checked byte-equal to the default), and the lane sweep with the
# tile book free to pick them (h200.py --untried) beside the same sweep without. Until the
# registry phase passes, the ring is not offered to serving's tile book (tiles.untried).
#
#   bash benchmarks/ring.sh OUT [phases]
#
# phases, in the order given: registry, kernels, lanes (default: all). Settings: BITS (registry
# widths, default "4 8 5 6"), LANES (default 1,16,64), MODELS (default 4bit).
set -u
OUT=${1:?usage: ring.sh OUT [phases]}
PHASES=${2:-registry kernels lanes}
TAIL=${TAIL:-16}
source "$(dirname "$0")/serve_lib.sh"  # phase, ways, card_start
card_start || exit 1

for p in $PHASES; do
    case $p in
        registry) for b in ${BITS:-4 8 5 6}; do
                      phase "registry-$b" 150 $py -m tensorfold.checks.registry \
                          --only "linear.affine$b.gluon.ring"
                  done ;;
        kernels)  for rows in 64 16; do
                      TAIL=60 phase "kernels-$rows" 240 $py benchmarks/kernels.py --no-recurrence \
                          --rows "$rows" --formats 4:64,8:64 --untried \
                          --only "lm head,mlp gate+up,mlp down,gdn in,gdn out"
                  done ;;
        lanes)    ways lanes 240 "- --untried" $py benchmarks/h200.py --out /tmp/bench \
                      --models "${MODELS:-4bit}" --lanes "${LANES:-1,16,64}" --sizes "" --in-memory ;;
    esac
done
