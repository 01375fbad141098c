#!/usr/bin/env bash
# A second venv, .venv-spark41, with the PySpark of SPARK41_VERSION
# (kafka_txn_sink/testing/versions.env) and this package: kafka_txn takes Arrow batches there
# (DataSourceStreamArrowWriter is new in 4.1). ci/setup.sh runs it: tests/e2e/test_arrow_writer.py
# runs its queries in this venv. The test bed itself stays on SPARK_VERSION (why: in
# versions.env). The benchmark resolves the 4.1 connector jars it needs by itself:
#
#   .venv/bin/python benchmarks/throughput.py --spark41-python .venv-spark41/bin/python
#
# KTS_PYSPARK41_FIND_LINKS=/dir with a downloaded pyspark tarball avoids a second download.
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
versions=kafka_txn_sink/testing/versions.env
spark_version="$(sed -n 's/^SPARK41_VERSION=//p' "$versions")"
[[ -n "$spark_version" ]] || { echo "setup_spark41: SPARK41_VERSION missing in $versions" >&2; exit 1; }
want="$(cat pyproject.toml "$versions" | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup_spark41: pip install -e . pyspark==$spark_version"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${links[@]}" \
    --config-settings editable_mode=compat -e . "pyspark==$spark_version"
  echo "$want" > "$stamp"
fi

"$venv/bin/python" -c "import pyspark; print('setup_spark41: pyspark', pyspark.__version__)"
