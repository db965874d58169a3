#!/usr/bin/env bash
# Set everything up, then run the main job on the embedded defaults:
# [train SmolLM2-135M's routers on Austen ->] record held-out windows into runs/smollm2-austen ->
# their perplexity under each attention pattern, written into the run -> stage times -> dashboard.
# Arguments go to `focus-lab quickstart` (e.g. --no-serve, --train, --port 8502).
set -euo pipefail
cd "$(dirname "$0")/.."
now() { date +%s.%N; }
t0=$(now)
bash scripts/setup.sh
t1=$(now)
.venv/bin/focus-lab prepare austen
t2=$(now)
# setup and prepare are timed here; the main job times its own stages and prints them all
exec .venv/bin/focus-lab quickstart \
  --stage-time "setup=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
  --stage-time "prepare=$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')" \
  "$@"
