#!/usr/bin/env bash
# One checkpoint (MLX layout), two servers on the same machine, one after the other: TensorFold and
# mlx_lm.server, each measured by `tensorfold bench decode` and `tensorfold bench prefill`.
#
#   benchmarks/side_by_side.sh CHECKPOINT OUTDIR [SIZES] [TOKENS]
#
# mlx_lm.server takes no token ids, so its prefill arrays travel as text (--as-text) and its
# decode tokens are counted from the text chunks; both are noted in the JSON records.
set -uo pipefail
ckpt=${1:?checkpoint folder}; out=${2:?output folder}; sizes=${3:-2048,8192}; tokens=${4:-256}
py=${PYTHON:-python3}
source "$(dirname "$0")/serve_lib.sh"
mkdir -p "$out"
tf() { $py -m tensorfold.cli "$@"; }

url=http://127.0.0.1:${PORT:-8094}
$py -m tensorfold.cli serve "$ckpt" --port "${url##*:}" --parallel 1 --context 65536 --chunk 2048 \
    --prompt-cache-gib 0 --served-model-name side ${SERVE_ARGS:-} >"$out/tensorfold-serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
wait_up "$url/v1/models" $pid "$out/tensorfold-serve.log" || exit 2
tf bench decode "$url" side --tokens "$tokens" --reps 3 --temperatures 0 --output "$out/tensorfold-decode.json"
tf bench prefill "$url" --model side --sizes "$sizes" --rounds 3 --output "$out/tensorfold-prefill.json"
kill $pid; wait $pid 2>/dev/null

url=http://127.0.0.1:${MLX_PORT:-8095}
# its own prompt cache off, as ours is: every prefill must start cold
$py -m mlx_lm.server --model "$ckpt" --port "${url##*:}" --prompt-cache-size 0 >"$out/mlx-serve.log" 2>&1 &
pid=$!
wait_up "$url/v1/models" $pid "$out/mlx-serve.log" || exit 2
tf bench decode "$url" default_model --tokens "$tokens" --reps 3 --temperatures 0 \
   --output "$out/mlx-decode.json"
tf bench prefill "$url" --model default_model --sizes "$sizes" --rounds 3 --as-text --tokenizer "$ckpt" \
   --output "$out/mlx-prefill.json"
