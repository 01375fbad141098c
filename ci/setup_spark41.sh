#!/usr/bin/env bash
# A second venv, .venv-spark41, with PySpark 4.1.1 and this package: only for the benchmark's
# Arrow write path (DataSourceStreamArrowWriter is new in 4.1). The test bed stays on 4.0.0 (see
# ci/versions.env: the 4.1.1 Kafka source fails on every restart, SPARK-55271, and Maven Central
# lacks the 4.1 token-provider jar), so the 4.1 jar set pairs spark-sql-kafka-0-10 and
# spark-avro 4.1.1 with the 4.0.0 token provider; the benchmark needs no restart.
#
#   ci/setup_spark41.sh                                  # then:
#   .venv/bin/python benchmarks/throughput.py --spark41-python .venv-spark41/bin/python
#
# KTS_PYSPARK41_FIND_LINKS=/dir with a downloaded pyspark-4.1.1.tar.gz avoids a second download.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=.venv-spark41
if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup_spark41: creating $venv"
  python3 -m venv "$venv"
fi
links=()
if [[ -n "${KTS_PYSPARK41_FIND_LINKS:-}" ]]; then
  links=(--find-links "$KTS_PYSPARK41_FIND_LINKS")
fi
stamp="$venv/.kts-installed"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)-4.1.1"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup_spark41: pip install -e . pyspark==4.1.1"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${links[@]}" \
    --config-settings editable_mode=compat -e . "pyspark==4.1.1"
  echo "$want" > "$stamp"
fi

echo "setup_spark41: resolving the 4.1.1 connector jars"
KTS_SPARK_KAFKA_VERSION=4.1.1 KTS_SPARK_AVRO_VERSION=4.1.1 \
  KTS_SPARK_TOKEN_PROVIDER_VERSION=4.0.0 \
  "$venv/bin/python" -c "import sys; sys.path.insert(0, 'ci'); import testbed; testbed.spark_jars()" \
  2> >(grep -v 'is installed but ci/versions.env pins' >&2)
"$venv/bin/python" -c "import pyspark; print('setup_spark41: pyspark', pyspark.__version__)"
