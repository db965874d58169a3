#!/usr/bin/env bash
# Set everything up, then run the main job on the embedded defaults:
# train SmolLM2-135M's routers on Austen -> held-out perplexity -> record a run -> dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/focus-lab prepare austen
exec .venv/bin/focus-lab quickstart "$@"
