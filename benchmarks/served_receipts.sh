#!/usr/bin/env bash
# Served receipts in one run: starts `tensorfold serve` on a checkpoint, runs the decode,
# concurrency, prefill, cancel and known-answer receipts against it, and stops it.
#
#   benchmarks/served_receipts.sh CHECKPOINT OUTDIR [SIZES] [TOKENS]
#
# On the GPU machine the server's packages travel as wheels (see benchmarks/README.md).
set -uo pipefail
ckpt=${1:?checkpoint folder}; out=${2:?output folder}; sizes=${3:-2048,8192,32768}; tokens=${4:-256}
port=${PORT:-8093}; url=http://127.0.0.1:$port
py=${PYTHON:-python3}
source "$(dirname "$0")/serve_lib.sh"
mkdir -p "$out"
serve() {  # serve PARALLEL CONTEXT: (re)start the server and wait for /health
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  $py -m tensorfold.cli serve "$ckpt" --port "$port" --parallel "$1" --context "$2" --prompt-cache-gib 0 \
      --served-model-name receipts ${SERVE_ARGS:-} >"$out/serve-$1.log" 2>&1 &
  pid=$!
  wait_up "$url/health" "$pid" "$out/serve-$1.log" || exit 2
}
trap '[ -n "${pid:-}" ] && kill "$pid" 2>/dev/null' EXIT
tf() { $py -m tensorfold.cli "$@"; }

serve 4 65536
tf bench decode "$url" receipts --tokens "$tokens" --reps 3 --temperatures 0 --output "$out/decode.json"
tf bench concurrent "$url" receipts --tokens "$tokens" --reps 3 --levels 1,4 --alone --serial \
   --output "$out/concurrent.json"
tf check cancel "$url" receipts --output "$out/cancel.json"
[ -z "${KNOWN:-}" ] || tf check known-answers "$url" receipts --thinking both --output "$out/known.json"
serve 1 131072
tf bench prefill "$url" --model receipts --sizes "$sizes" --rounds 3 --output "$out/prefill.json"
