#!/usr/bin/env bash
# Set everything up, then run the main job on the embedded defaults:
# [train SmolLM2-135M's routers on Austen ->] record held-out windows into runs/smollm2-austen ->
# their perplexity under each attention pattern, written into the run -> stage times -> dashboard.
# Arguments go to `focus-lab quickstart` (e.g. --no-serve, --train, --port 8502).
set -euo pipefail
cd "$(dirname "$0")/.."
now() { date +%s.%N; }
# run a command; write the peak RSS of its largest process (GiB) into the file named first
peak() {
  local out=$1; shift
  python3 -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%.3f" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20))
sys.exit(rc)' "$out" "$@"
}
mem=$(mktemp -d)
trap 'rm -rf "$mem"' EXIT
t0=$(now)
peak "$mem/setup" bash scripts/setup.sh
t1=$(now)
peak "$mem/prepare" .venv/bin/focus-lab prepare austen
t2=$(now)
# setup and prepare are timed here; the main job times its own stages and prints them all
setup="setup=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')/$(cat "$mem/setup")"
prepare="prepare=$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')/$(cat "$mem/prepare")"
exec .venv/bin/focus-lab quickstart --stage-time "$setup" --stage-time "$prepare" "$@"
