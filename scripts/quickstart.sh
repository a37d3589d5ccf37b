#!/usr/bin/env bash
# The README's first command: install, prepare the bundled models, run the job on a few
# calls it synthesizes itself, print the summary and where the Parquet files are.
#   bash scripts/quickstart.sh [OUTPUT]     # OUTPUT defaults to demo-output/
#
# It installs into the active virtual environment; without one, into .venv here (made when
# missing, reused after). Always a virtual environment, not only where the system Python
# refuses pip (PEP 668, Debian/Ubuntu; install.sh says so): the quick start then changes no
# Python that other programs use, and `rm -rf .venv` undoes it. PYTHON=/path/to/python
# installs with that interpreter instead, as install.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'quickstart.sh: %s\n' "$*"; }

# The same test as install.sh's: a virtual environment's prefix differs from its base's.
in_venv='import sys; sys.exit(sys.prefix == sys.base_prefix)'
made_venv=""
if [ -n "${PYTHON:-}" ]; then
  say "installing with PYTHON=$PYTHON"
elif python3 -c "$in_venv" 2>/dev/null; then
  PYTHON=python3
  say "installing into the active virtual environment $(python3 -c 'import sys; print(sys.prefix)')"
else
  PYTHON="$PWD/.venv/bin/python"
  if [ ! -x "$PYTHON" ]; then
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || {
      say "python3 is $(python3 --version 2>&1); overnight needs Python >= 3.11: python3.11 -m venv .venv, then rerun" >&2
      exit 1
    }
    say "no virtual environment is active: making one in .venv"
    python3 -m venv .venv || {
      say "python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv), then rerun" >&2
      exit 1
    }
  else
    say "no virtual environment is active: using the one in .venv"
  fi
  made_venv=1
fi

PYTHON="$PYTHON" bash scripts/install.sh
"$PYTHON" -m overnight.jobs.cli demo --output "${1:-demo-output}"
if [ -n "$made_venv" ]; then
  say "overnight is installed in .venv; to use the overnight command in this shell: . .venv/bin/activate"
fi
