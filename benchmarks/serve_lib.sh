# Shared by the benchmark scripts that start a server: source it after setting $py.

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
