#!/bin/bash
# The quantized formats on a GPU machine in one call: one stream and 4 lanes of each 9B format
# with its 2k and 8k prompts, the 27B at 4 bits, single products at 4 and 6 bits (TB/s), a one-lane
# step's launches, the 9B invariants of tests/test_gpu.py in each format, and llama.cpp on the
# same weights at Q4_0, Q4_K_M and Q8_0 (llama-bench tg128), built in the background.
#
#   bash benchmarks/formats.sh OUT [phases]
#
# phases, in the order given: peerbuild (the kit in .peers/llamacpp: build and bf16 GGUF in the
# background), ours, big (the 27B), products, profile, tests, peer (waits for peerbuild; Q8_0
# quantized here from the kit's bf16 GGUF). Default: all. Settings: FORMATS (default
# 4bit,mixed45,mixed,8bit), TEST_FORMATS (default 4bit mixed45 mixed).
set -u
OUT=${1:?usage: formats.sh OUT [phases]}
PHASES=${2:-peerbuild ours big products profile tests peer}
TAIL=${TAIL:-16}
source "$(dirname "$0")/serve_lib.sh"  # phase, card_start
card_start || exit 1
LCP=/tmp/lcp

peer() {
    [ -n "${PEER_BUILD:-}" ] && wait "$PEER_BUILD"
    LCP_QUANTS="q4_0 q4_k_m" LCP_BUDGET=${LCP_BUDGET:-240} bash .peers/llamacpp/run.sh "$OUT/peer" all \
        > "$OUT/peer.log" 2>&1
    head -20 "$OUT/peer/summary.md" 2>/dev/null
    local bin=$LCP/llama.cpp/build/bin
    [ -f "$LCP/m-q8_0.gguf" ] || phase quant-q8_0 120 "$bin/llama-quantize" "$LCP/m-bf16.gguf" \
        "$LCP/m-q8_0.gguf" Q8_0 16
    phase bench-q8_0 90 "$bin/llama-bench" -m "$LCP/m-q8_0.gguf" -ngl 99 -fa 1 -r 3 -p 0 -n 128
}

for p in $PHASES; do
    case $p in
        peerbuild) peer_build ;;
        ours)     phase ours 300 $py benchmarks/h200.py --out /tmp/bench --models \
                      "${FORMATS:-4bit,mixed45,mixed,8bit}" --lanes 1,4 --sizes 2048,8192 --in-memory ;;
        big)      phase big 200 $py benchmarks/h200.py --out /tmp/bench --models 4bit --lanes 1 \
                      --sizes 8192 --in-memory --shape 27b ;;
        products) TAIL=30 phase products 200 $py benchmarks/kernels.py --no-recurrence --rows 1 \
                      --formats 4:64,6:64 ;;
        profile)  TAIL=30 phase profile 150 $py benchmarks/profile_decode.py --out /tmp/prof \
                      --in-memory --models 4bit --lanes 1 ;;
        tests)    for f in ${TEST_FORMATS:-4bit mixed45 mixed}; do
                      phase "tests-$f" 240 $py -m pytest -q -x -p no:cacheprovider tests/test_gpu.py \
                          --gpu-format "$f" -k "not registry"
                  done ;;
        peer)     peer ;;
    esac
done
wait  # a background phase ends inside the call
