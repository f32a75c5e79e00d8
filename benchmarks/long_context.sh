#!/bin/bash
# Long context on a GPU machine, in one go: the attention kernel's registry entry and GPU tests,
# the kernel alone at depth (attention_depth.py), decode at depth and long prompts (h200.py), and
# llama.cpp's llama-bench at the same depths (when a llama.cpp build kit with a run.sh is in
# .peers/llamacpp).
#
#   bash benchmarks/long_context.sh OUT [phases]
#
# phases, in the order given: check probe depth depth27b prompts tests peer, and peerbuild (llama.cpp's
# build and GGUF made in the background while the next phases run; `peer` then only quantizes
# and times). TESTS holds pytest groups split by '|', run side by side (exactness, not timing).
#
# Wheels for the packages the machine lacks go in .whl (benchmarks/README.md); each phase runs
# under its own time limit and its log goes to OUT.
set -u
OUT=${1:?usage: long_context.sh OUT [phases]}
PHASES=${2:-check probe depth}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=src:tests
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

TAIL=${TAIL:-40}
source "$(dirname "$0")/serve_lib.sh"  # phase
site_wheels || exit 1

tests() {  # each '|'-separated group of TESTS in its own pytest, side by side
    local i=0 pids=() group
    IFS='|' read -ra groups <<< "${TESTS:-tests/test_gpu_long_context.py}"
    for group in "${groups[@]}"; do
        i=$((i + 1))
        phase "tests-$i" "${TEST_LIMIT:-420}" python3 -m pytest -q $group &
        pids+=($!)
    done
    wait "${pids[@]}"
}

peer() {  # llama.cpp's kit: llama-bench at the depths of the decode runs
    LCP_QUANTS="q4_0 bf16" LCP_PP=512 LCP_BUDGET=${LCP_BUDGET:-540} \
        LCP_BENCH="-ngl 99 -fa 1 -r 3 -d 0,8192,32768" bash .peers/llamacpp/run.sh "$OUT/peer" "$1"
}

for p in $PHASES; do
    case $p in
        check)   phase check 240 python3 -m tensorfold.checks.registry --only attention ;;
        probe)   phase probe "${PROBE_LIMIT:-240}" python3 benchmarks/attention_depth.py ${PROBE_ARGS:-} ;;
        depth)   phase depth "${DEPTH_LIMIT:-300}" python3 benchmarks/h200.py --out /tmp/bench \
                     --shape "${SHAPE:-9b}" --models "${MODELS:-4bit,bf16}" --lanes "" --sizes "" --in-memory \
                     --decode-context "${DEPTHS:-0,8192,32768,131072,0x4,8192x4,0x16,8192x16}" ;;
        depth27b) phase depth27b "${DEPTH_LIMIT:-300}" python3 benchmarks/h200.py --out /tmp/bench \
                     --shape 27b --models 4bit --lanes "" --sizes "" --in-memory \
                     --decode-context "${DEPTHS27:-0,32768}" ;;
        prompts) phase prompts "${PROMPT_LIMIT:-240}" python3 benchmarks/h200.py --out /tmp/bench \
                     --models bf16 --lanes "" --sizes "${SIZES:-32768,65536,131072}" --in-memory \
                     --attention "${ATTN:-}" ;;
        tests)   tests ;;
        peerbuild) (renice -n 19 $BASHPID > /dev/null  # the build yields the cores to the tests
                    LCP_BUDGET=${LCP_BUILD_BUDGET:-420} peer build > "$OUT/peerbuild.log" 2>&1) &
                 PEER_BUILD=$! ;;
        peer)    [ -n "${PEER_BUILD:-}" ] && wait "$PEER_BUILD"
                 peer all > "$OUT/peer.log" 2>&1
                 echo "=== peer rc=$?"; cat "$OUT/peer/summary.md" 2>/dev/null | head -30 ;;
    esac
done
