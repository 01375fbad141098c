#!/usr/bin/env bash
# The CI tier, what lands with every change: set-up, lint, types, the tests (three pytest workers:
# the e2e tests wait on brokers, timeouts and JVM starts for much of their time) but those
# marked `full`, the unit and Kafka tiers with the oldest Kafka clients the ranges
# allow (the main venv has the newest), and the installed wheel. Tier timings are printed last.
# With arguments, only pytest runs, with them (and every test they name, `full` or not):
#   ci/test.sh tests/e2e/test_two_drivers.py -k frozen
# ci/test_full.sh is the full tier: every test, the `full` ones included.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

status=0
timings=()
tier() {  # tier NAME COMMAND...: runs it, records its time and result; a failure does not stop CI
  local name=$1 started=$SECONDS rc=0
  shift
  echo "== $name"
  "$@" || rc=$?
  [[ $rc -eq 0 ]] || status=1
  timings+=("$(printf '%-34s %6d s  %s' "$name" $((SECONDS - started)) \
    "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED (exit $rc)")")")
}

pytest_tier() {  # exit 5 (no test collected) is a failure too
  local rc=0 marker
  marker="$(mktemp)"
  EXECNET_DEBUG=1 .venv/bin/pytest -n "${KTS_PYTEST_WORKERS:-3}" --dist loadgroup --durations=30 \
    "$@" || rc=$?
  if [[ $rc -eq 5 ]]; then
    echo "test.sh: pytest collected no tests: that is a failure" >&2
  elif [[ $rc -ne 0 ]]; then
    ci/worker_traces.sh "$marker"
  fi
  rm -f "$marker"
  return "$rc"
}

started=$SECONDS
tier "setup (ci/setup.sh)" ci/setup.sh
if [[ $status -ne 0 ]]; then
  exit 1
fi
tier "ruff check" .venv/bin/ruff check
tier "ruff format --check (package)" .venv/bin/ruff format --check kafka_txn_sink
tier "mypy" .venv/bin/mypy
if [[ $# -gt 0 ]]; then
  tier "pytest $*" pytest_tier "$@"
else
  tier "pytest (CI tier: not full)" pytest_tier -m "not full"
  tier "oldest Kafka clients (unit, kafka)" ci/test_clients.sh oldest
  tier "ci/check_wheel.sh" ci/check_wheel.sh
fi

echo "== tier timings"
printf '%s\n' "${timings[@]}"
printf '%-34s %6d s  %s\n' "all" $((SECONDS - started)) "$([[ $status -eq 0 ]] && echo ok || echo FAILED)"
exit "$status"
