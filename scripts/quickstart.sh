#!/usr/bin/env bash
# The README's first command: install, prepare the bundled models, run the job on a few
# calls it synthesizes itself, print the summary and where the Parquet files are.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
overnight demo --output "${1:-demo-output}"
