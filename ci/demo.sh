#!/usr/bin/env bash
# The quick start: set up the clone for the demo (once: `ci/setup.sh demo`), then run the demo: log events through one kafka_txn
# sink into a records topic and Avro files partitioned by user/date/hour, the driver killed once
# after a decision, the query restarted, and every id verified in the records and in the files.
# Arguments go to examples/demo.py (--events N, --batches N, --timeout S, --keep).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ci/setup.sh demo
exec .venv/bin/python examples/demo.py "$@"
