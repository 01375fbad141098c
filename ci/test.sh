#!/usr/bin/env bash
# The whole check: set-up, lint, types, tests, the installed wheel. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ci/setup.sh

echo "== ruff check"
.venv/bin/ruff check
echo "== mypy"
.venv/bin/mypy
echo "== pytest $*"
status=0
.venv/bin/pytest --durations=30 "$@" || status=$?
if [[ $status -eq 5 ]]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
# The whole check also tries the wheel as a user installs it; a run of chosen tests does not.
if [[ $# -eq 0 ]]; then
  echo "== ci/check_wheel.sh"
  ci/check_wheel.sh || status=$?
fi
exit "$status"
