#!/bin/bash
# The one-launch conv's channel block (ops/triton/conv.py LANE_BLOCK), a launch shape only: for
# each block, the registry's conv check (one launch = two launches, bitwise, its controls red)
# and verify_cost.py at one lane, K=7 (a decode pass of one row, a verify pass of eight).
#
#   bash benchmarks/conv_block.sh OUT ["256 128 64 32"]
set -u
OUT=${1:?usage: conv_block.sh OUT [blocks]}
BLOCKS=${2:-256 128 64 32}
source "$(dirname "$0")/serve_lib.sh"  # phase, card_start
card_start || exit 1
for b in $BLOCKS; do
    set_block="import sys, runpy; import tensorfold.ops.triton.conv as c; c.LANE_BLOCK = $b"
    TAIL=3 phase "check$b" 240 $py -c "$set_block; sys.argv[0] = 'registry'; \
runpy.run_module('tensorfold.checks.registry', run_name='__main__')" --only conv
    TAIL=3 phase "time$b" 240 $py -c "$set_block; sys.argv[0] = 'verify_cost'; \
runpy.run_path('benchmarks/verify_cost.py', run_name='__main__')" --out /tmp/verify --models 4bit \
        --lanes 1 --draft-tokens 7 $(verify_checkpoint 4bit)
done
for b in $BLOCKS; do echo "block $b: $(grep '^| 4bit' "$OUT/time$b.log")"; done
