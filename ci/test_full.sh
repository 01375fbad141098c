#!/usr/bin/env bash
# The full tier: every test (the `full` ones too: the kill-point matrix on both Spark lines, the
# long stress tests) on .venv's newest Kafka clients, the oldest clients' tiers, and the wheel;
# its latest results are in docs/development.md. Longer than CI's budget; run it before a release and after a change
# to the protocol. The crash suite's long runs and the benchmarks have their own commands.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
status=0
ci/test.sh tests || status=1
ci/test_clients.sh oldest || status=1
ci/check_wheel.sh || status=1
exit "$status"
