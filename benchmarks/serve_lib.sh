# Shared by the benchmark scripts: source it after setting $py (and $OUT, for `phase`).

# site_wheels: install the wheels in .whl (packages a GPU machine lacks, benchmarks/README.md) into
# /tmp/site (once a machine: two scripts run side by side share it) and put it first on
# PYTHONPATH; nothing when .whl holds none.
site_wheels() {
    ls .whl/*.whl >/dev/null 2>&1 || return 0
    if [ ! -e /tmp/site/.installed ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl && touch /tmp/site/.installed || return 1
    fi
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
}

# up URL: true once URL answers.
up() { $py -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null; }

# wait_up URL PID LOG: wait (up to 450 s) until URL answers; if the server exits first or never
# answers, print its log and return 2.
wait_up() {
  for _ in $(seq 1 900); do
    up "$1" && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.5
  done
  echo "server did not start"; cat "$3"; return 2
}

# phase NAME SECONDS CMD...: run CMD under a time limit, its output in $OUT/NAME.log; print its
# exit code, its time and the log's last ${TAIL:-24} lines.
phase() {
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit} s)"
    local t=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    # also kept under $OUT: a call that runs out of time loses its printed output, not its files
    echo "=== $name rc=$rc in $(( $(date +%s) - t )) s" | tee -a "$OUT/phases.txt"
    tail -n "${TAIL:-24}" "$OUT/$name.log"
}

# card_start: the start of a GPU machine's script (after setting $OUT): the output folder, the
# project on PYTHONPATH, $py, the card and the commit written to $OUT, the wheels installed.
card_start() {
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1 PYTHONPATH=src:tests:benchmarks
    py=python3
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
    git log -1 --format=%h 2>/dev/null | tee "$OUT/commit.txt"
    site_wheels
}

# verify_checkpoint MODEL: --checkpoint for verify_cost.py's random MODEL checkpoint once a run
# wrote it (its index is written last), so later runs on the machine read it instead
verify_checkpoint() {
    [ -e "/tmp/verify/$1/model.safetensors.index.json" ] && echo "--checkpoint /tmp/verify/$1"
}

# ways NAME LIMIT "WAY..." CMD...: CMD once for each way, one process each, as phase NAME<way>;
# a way is a flag added at CMD's end, or - for CMD as it is (a sweep with and without a flag).
ways() {
    local name=$1 limit=$2 list=$3 way
    shift 3
    for way in $list; do
        [ "$way" = - ] && way=
        phase "$name$way" "$limit" "$@" $way
    done
}

# base_tree REV DIR: the project's files at commit REV in DIR (once), for timing a change against
# the tree before it in the same call on the same card (PYTHONPATH=DIR/src:DIR/tests:DIR/benchmarks).
base_tree() {
    [ -d "$2/src" ] || { mkdir -p "$2" && git archive "$1" src tests benchmarks | tar -x -C "$2"; }
}

# peer_build: the llama.cpp kit in .peers/llamacpp builds (and writes its bf16 GGUF) in the
# background at low priority, its log in $OUT/peerbuild.log; $PEER_BUILD is its job to wait for.
peer_build() {
    (renice -n 19 $BASHPID > /dev/null
     LCP_BUDGET=${LCP_BUILD_BUDGET:-420} bash .peers/llamacpp/run.sh "$OUT/peer" build \
         > "$OUT/peerbuild.log" 2>&1) &
    PEER_BUILD=$!
}
