#!/bin/bash
# The Gluon ring on pieces of 64 or 128 rows for 65-512 packed rows (offered to 128 rows since
# this passed on a card; tiles.untried past that), on a GPU machine in one call: the registry's
# product entries (every launch shape, the untried ones included, against the default at 100
# and 300 rows, with the planted controls), the 9B's products at 80, 128 and 256 rows with the
# untried shapes timed beside the offered ones, the lane sweep with the book free to pick them
# (h200.py --untried) beside the same sweep without, and a 16-lane verify pass of 5 rows a lane
# both ways (verify_cost.py), one process each.
#
#   bash benchmarks/pieces.sh OUT [phases]
#
# phases, in the order given: registry, kernels, lanes, verify (default: all). Settings: LANES
# (default 16,64,256), MODELS (default 4bit).
set -u
OUT=${1:?usage: pieces.sh OUT [phases]}
PHASES=${2:-registry kernels lanes verify}
TAIL=${TAIL:-16}
source "$(dirname "$0")/serve_lib.sh"  # phase, ways, card_start
card_start || exit 1

for p in $PHASES; do
    case $p in
        registry) phase registry 480 $py -m tensorfold.checks.registry --only linear.affine ;;
        kernels)  for rows in 80 128 256; do
                      TAIL=40 phase "kernels-$rows" 240 $py benchmarks/kernels.py --no-recurrence \
                          --rows "$rows" --formats 4:64 --untried \
                          --only "lm head,mlp gate+up,mlp down,gdn in,gdn out"
                  done ;;
        lanes)    ways lanes 240 "- --untried" $py benchmarks/h200.py --out /tmp/bench \
                      --models "${MODELS:-4bit}" --lanes "${LANES:-16,64,256}" --sizes "" --in-memory ;;
        verify)   ways verify 150 "- --untried" $py benchmarks/verify_cost.py --out /tmp/verify \
                      --models "${MODELS:-4bit}" --lanes 16 --draft-tokens 4 ;;
    esac
done
