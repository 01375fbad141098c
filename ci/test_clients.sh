#!/usr/bin/env bash
# The unit tier and the Kafka integration tier with the oldest or the newest confluent-kafka and
# kafka-python that pyproject.toml allows (kafka_txn_sink/kafka/client_versions.py):
#   ci/test_clients.sh oldest|newest
# A venv of its own gets the two clients (oldest: the ranges' lower ends exactly; newest: the
# newest pip finds within the ranges); every other package comes from the CI venv (.venv, or
# KTS_BASE_VENV) through a .pth file, after the venv's own site-packages, so the clients chosen
# here win. The Kafka tier is tests/integration -m "kafka and not spark and not s3" (the
# producer, the EndTxn client, fate probing, the CLI against the broker). ci/test.sh runs the
# oldest end (its main venv has the newest clients, so the whole CI tier runs on that end);
# ci/test_full.sh does the same. `newest` checks that end apart from .venv. Results go in
# docs/compatibility.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
end=${1:?usage: ci/test_clients.sh oldest|newest}
base=${KTS_BASE_VENV:-$PWD/.venv}
venv=${KTS_CLIENTS_VENV:-${TMPDIR:-/tmp}/kts-clients-$end}
started=$SECONDS

requirements="$(PYTHONPATH=$PWD "$base/bin/python" - "$end" <<'PY'
import sys

from kafka_txn_sink.kafka.client_versions import CLIENTS

for supported in CLIENTS:
    print(f"{supported.distribution}=={supported.low}" if sys.argv[1] == "oldest"
          else supported.requirement)
PY
)"
[[ "$end" == oldest || "$end" == newest ]] || { echo "test_clients: oldest or newest" >&2; exit 2; }

rm -rf "$venv"
"$base/bin/python" -m venv "$venv"
base_site="$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$base_site" > "$site/kts_base_venv.pth"
# shellcheck disable=SC2086  # one requirement a line
timeout 600 "$venv/bin/python" -m pip install -q --no-deps $requirements
"$venv/bin/python" - <<'PY'
import confluent_kafka
import kafka

print(f"test_clients: confluent-kafka {confluent_kafka.__version__} "
      f"(librdkafka {confluent_kafka.libversion()[0]}), kafka-python {kafka.__version__}")
PY

run() {
  local name=$1 tier_started=$SECONDS  # a tier's failure does not stop the next
  shift
  echo "== $name tier"
  touch "$venv/$name.started"
  EXECNET_DEBUG=1 PYTHONPATH=$PWD timeout 3600 "$venv/bin/python" -m pytest -q -rfE \
    -p no:cacheprovider --durations=10 -n "${KTS_PYTEST_WORKERS:-3}" "$@" \
    > "$venv/$name.log" 2>&1 || status=1
  grep -E '^(FAILED|ERROR) |^[0-9]+ (passed|failed)' "$venv/$name.log" || tail -20 "$venv/$name.log"
  if grep -q "crashed while running" "$venv/$name.log"; then
    ci/worker_traces.sh "$venv/$name.started"
  fi
  echo "   $name: $((SECONDS - tier_started)) s"
}
status=0
run unit tests/unit -m "not msk_iam"
# Less the hundred restarts: they check the id pool over runs, not a client (the CI tier runs
# them on the newest clients), and took 230 s of this tier's 339 (2026-11-27). Less MSK IAM,
# which needs confluent-kafka 2.13 (the sink refuses older at start by name:
# tests/unit/test_kafka_security.py, which the unit tier below runs).
run kafka tests/integration -m "kafka and not spark and not s3 and not msk_iam" \
  --deselect tests/integration/test_restart_ids.py::test_a_hundred_restarts_leave_a_bounded_set_of_ids
echo "test_clients $end: $((SECONDS - started)) s, logs in $venv/*.log"
exit "$status"
