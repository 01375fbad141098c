#!/usr/bin/env bash
# The quick start: set up the clone (once), then run the exactly-once demo with one injected
# task failure. Arguments go to examples/demo.py (--events N, --batches N, --keep).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ci/setup.sh
exec .venv/bin/python examples/demo.py "$@"
