#!/bin/bash
# Many streams on a GPU machine, in one go: where a many-lane decode step's kernels spend the
# card's time (profile_decode.py), the lane sweep (h200.py), a long prompt admitted beside
# running streams (admit_gap.py), and served runs of `tensorfold bench serve` against
# `tensorfold serve` and llama.cpp's `llama-server -np N` (with llama-batched-bench) on the same
# shape, when a llama.cpp build kit with a run.sh is in .peers/llamacpp.
#
#   bash benchmarks/many_streams.sh OUT [phases]
#
# phases, in the order given: peerbuild (llama.cpp's build and GGUF in the background; `peer`
# waits for it), tests (tests/test_gpu_lanes.py: concurrent = solo up to 256 lanes, graph =
# eager, a stream beside a long prompt), profile, lanes, packed (the widest lane count again
# with the weights left packed, `--no-unpacked-weights`), admit, ckpt (a random 4-bit checkpoint on disk for the served
# runs; ckptbg writes it in the background while the next phases run, `served` waits for it),
# served (ours), peer (llama-bench, llama-batched-bench, then llama-server under the
# same bench serve). Settings: MODELS, LANES, PROFILE_LANES, CONC, SERVE_PARALLEL, SERVE_ARGS (more
# `tensorfold serve` flags, e.g. --mixed-chunk 256), LANES_LIMIT (s), BENCH_ARGS (more `bench serve` flags),
# TEMPERATURE, ADMIT_*.
set -u
OUT=${1:?usage: many_streams.sh OUT [phases]}
PHASES=${2:-profile lanes admit}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=src:tests:benchmarks
py=python3
source "$(dirname "$0")/serve_lib.sh"
site_wheels || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
CKPT=/tmp/tf-9b-4bit
CONC=${CONC:-1,16,64}
BENCH_SERVE="--concurrency $CONC --input-len 1024 --output-len 512 --tokenizer src/tensorfold/demo/bf16"
BENCH_SERVE+=" --temperature ${TEMPERATURE:-0}"  # 1: the sampled path, the API's default
BENCH_SERVE+=" ${BENCH_ARGS:-}"  # more bench serve flags, e.g. --num-prompts 128

served() {  # served NAME PORT CMD...: start a server, bench serve it, stop it
    local name=$1 port=$2; shift 2
    "$@" > "$OUT/$name-server.log" 2>&1 &
    local pid=$!
    if wait_up "http://127.0.0.1:$port/health" "$pid" "$OUT/$name-server.log"; then
        $py -m tensorfold.cli bench serve "http://127.0.0.1:$port" m $BENCH_SERVE \
            --output "$OUT/$name.json"
    fi
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    tail -n 5 "$OUT/$name-server.log"
}

peer() {
    [ -n "${PEER_BUILD:-}" ] && wait "$PEER_BUILD"
    LCP_QUANTS="q4_0 batched" LCP_BPL=${LCP_BPL:-1,16,64,256} LCP_BUDGET=${LCP_BUDGET:-300} \
        bash .peers/llamacpp/run.sh "$OUT/peer" all > "$OUT/peer.log" 2>&1
    echo "=== peer rc=$?"; head -40 "$OUT/peer/summary.md" 2>/dev/null
    local np=${SERVE_PARALLEL:-64}
    echo "=== peer-served"
    served peer-served 8091 timeout "${PEER_SERVE_LIMIT:-400}" /tmp/lcp/llama.cpp/build/bin/llama-server \
        -m /tmp/lcp/m-q4_0.gguf -ngl 99 -fa on -np "$np" -c $((np * 2048)) --cache-ram 0 --host 127.0.0.1 --port 8091 \
        > "$OUT/peer-served.log" 2>&1
    tail -n 30 "$OUT/peer-served.log"
}

for p in $PHASES; do
    case $p in
        peerbuild) peer_build ;;
        tests)   phase tests 300 $py -m pytest -q -x -p no:cacheprovider tests/test_gpu_lanes.py \
                     --durations=8 ;;
        profile) phase profile 240 $py benchmarks/profile_decode.py --out /tmp/prof --in-memory \
                     --models "${MODELS:-4bit,bf16}" --lanes "${PROFILE_LANES:-64}" ;;
        lanes)   phase lanes "${LANES_LIMIT:-300}" $py benchmarks/h200.py --out /tmp/bench --models "${MODELS:-4bit,bf16}" \
                     --lanes "${LANES:-64,128,256}" --sizes "" --in-memory ;;
        packed)  widest=${LANES:-64,128,256}
                 phase packed 200 $py benchmarks/h200.py --out /tmp/bench --models 4bit \
                     --lanes "${widest##*,}" --sizes "" --in-memory --no-unpacked-weights ;;
        admit)   phase admit 300 $py benchmarks/admit_gap.py --models "${ADMIT_MODELS:-4bit}" \
                     --lanes "${ADMIT_LANES:-1,16}" --prompt "${ADMIT_PROMPT:-32768}" \
                     --mixed "${ADMIT_MIXED:-0,128,256,512}" ;;
        ckpt)    [ -d "$CKPT" ] || phase ckpt 200 $py -m tensorfold.cli make-random "$CKPT" --shape 9b \
                     --quantize 4 --device cuda --tokenizer src/tensorfold/demo/bf16 ;;
        ckptbg)  [ -d "$CKPT" ] || { (phase ckpt 200 $py -m tensorfold.cli make-random "$CKPT" --shape 9b \
                     --quantize 4 --device cuda --tokenizer src/tensorfold/demo/bf16) & CKPT_JOB=$!; } ;;
        served)  [ -n "${CKPT_JOB:-}" ] && wait "$CKPT_JOB"  # a ckptbg phase's checkpoint
                 echo "=== served"
                 served served 8090 timeout 400 $py -m tensorfold.cli serve "$CKPT" --port 8090 \
                     --parallel "${SERVE_PARALLEL:-64}" --context 2048 --prompt-cache-gib 0 \
                     --served-model-name m ${SERVE_ARGS:-} > "$OUT/served.log" 2>&1
                 tail -n 30 "$OUT/served.log" ;;
        peer)    peer ;;
    esac
done
wait  # background phases (peerbuild, ckptbg) end inside the call
