#!/usr/bin/env bash
# The bundled demo model's receipts on this machine's default device: its known answers over HTTP
# (thinking off and on), then teacher-forced fidelity of our bf16 engine against a transformers
# float32 history, with the float64 replay as arbiter.
#
#   benchmarks/demo_receipts.sh OUTDIR [TOKENS]
set -uo pipefail
out=${1:?output folder}; tokens=${2:-128}
py=${PYTHON:-python3}; port=${PORT:-8096}; url=http://127.0.0.1:$port
source "$(dirname "$0")/serve_lib.sh"
ckpt=$($py -c "from tensorfold.demo import demo_checkpoint; print(demo_checkpoint())") || exit 2
mkdir -p "$out"
$py -m tensorfold.cli serve "$ckpt" --port "$port" --served-model-name demo ${SERVE_ARGS:-} \
    >"$out/demo-serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
wait_up "$url/health" $pid "$out/demo-serve.log" || exit 2
$py -m tensorfold.cli check known-answers "$url" demo --thinking both --output "$out/known.json"
kill $pid; wait $pid 2>/dev/null
PYTHONPATH=${PYTHONPATH:-}:src $py scripts/reference_history.py "$ckpt" --out "$out/history.json" --tokens "$tokens"
$py -m tensorfold.cli check fidelity "$ckpt" --history "$out/history.json" --dtype bfloat16 --float64 \
    --output "$out/fidelity.json"
