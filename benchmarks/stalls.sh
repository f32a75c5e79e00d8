#!/bin/bash
# Where a packed product's warps stall, read by Nsight Compute on a GPU machine: each case runs
# benchmarks/product_probe.py under `ncu --set full` (only the launches inside its "probe" range),
# prints a line per kernel (time, throughput, occupancy, registers, stall reasons: ncu_stalls.py)
# and keeps the report and its per-instruction source page (SASS) under OUT.
#
#   bash benchmarks/stalls.sh OUT "PRODUCT:ROWS:SHAPES" ...
#   e.g. bash benchmarks/stalls.sh /tmp/stalls "lm head:1:gluon,staged" "mlp gate+up:64:affine64,ring"
set -u
OUT=${1:?usage: stalls.sh OUT PRODUCT:ROWS:SHAPES ...}
shift
source "$(dirname "$0")/serve_lib.sh"  # card_start
card_start || exit 1
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
i=0
for case in "$@"; do
    IFS=: read -r product rows shapes <<< "$case"
    i=$((i + 1))
    rep="$OUT/case$i"
    echo "=== case $i: $product, $rows rows: $shapes"
    timeout -k 5 "${CASE_LIMIT:-150}" "$ncu" --nvtx --nvtx-include probe/ --set full -f -o "$rep" \
        $py benchmarks/product_probe.py --product "$product" --rows "$rows" --shapes "$shapes" \
        > "$rep.log" 2>&1
    echo "rc=$?"; grep -E '^(warm|launch)' "$rep.log"; grep -E '==(ERROR|WARNING)==' "$rep.log" | head -3
    "$ncu" --import "$rep.ncu-rep" --page raw --csv 2>/dev/null | $py benchmarks/ncu_stalls.py
    "$ncu" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
done
