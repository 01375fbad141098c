#!/usr/bin/env bash
# The newest Spark line's venv, .venv-spark-newest: the PySpark of SPARK_NEWEST_VERSION
# (kafka_txn_sink/testing/versions.env, 4.3.0) and this package. There kafka_txn takes Arrow
# batches (DataSourceStreamArrowWriter, new in 4.1); its Kafka source and sink jars are
# SPARK_NEWEST_CONNECTOR_VERSION's (4.2.0: 4.3.0 is not served here). ci/setup.sh runs it; the e2e
# tests marked for both Spark lines and tests/e2e/test_arrow_writer.py run their queries in this
# venv, and the benchmark takes it as its second line (PySpark comes with its `connect` extra,
# grpcio, pandas and the rest: tests/e2e/test_spark_connect.py runs it as a Spark Connect client):
#
#   .venv/bin/python benchmarks/throughput.py --newest-python .venv-spark-newest/bin/python
#
# KTS_PYSPARK_NEWEST_FIND_LINKS=/dir with a downloaded pyspark tarball avoids a second download.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=.venv-spark-newest
if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup_spark_newest: creating $venv"
  python3 -m venv "$venv"
fi
links=()
if [[ -n "${KTS_PYSPARK_NEWEST_FIND_LINKS:-}" ]]; then
  links=(--find-links "$KTS_PYSPARK_NEWEST_FIND_LINKS")
fi
stamp="$venv/.kts-installed"
versions=kafka_txn_sink/testing/versions.env
spark_version="$(sed -n 's/^SPARK_NEWEST_VERSION=//p' "$versions")"
[[ -n "$spark_version" ]] || { echo "setup_spark_newest: SPARK_NEWEST_VERSION missing in $versions" >&2; exit 1; }
want="$(cat pyproject.toml "$versions" ci/setup_spark_newest.sh | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup_spark_newest: pip install -e '.[spark,all]' pyspark[connect,pipelines]==$spark_version"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${links[@]}" \
    --config-settings editable_mode=compat -e '.[spark,all]' "pyspark[connect,pipelines]==$spark_version"
  echo "$want" > "$stamp"
fi

"$venv/bin/python" -c "import pyspark; print('setup_spark_newest: pyspark', pyspark.__version__)"
