#!/usr/bin/env bash
# Idempotent set-up of a clone: .venv with the package, its dev tools and the pyspark pinned in
# kafka_txn_sink/testing/versions.env; .venv-spark-newest with PySpark 4.3 (ci/setup_spark_newest.sh);
# then every jar of the test bed (Kafka broker, Spark packages) resolved from Maven Central into
# the cache ($KTS_CACHE or ~/.cache/kafka_txn_sink), and the Schema Registry (Apicurio Registry,
# built by Maven from Maven Central's jars) that the record formats' tests run against, and
# Prometheus (Debian's package, unpacked into the cache) that scrapes the sink's metrics.
# Needs only python3, java and mvn on PATH. `ci/setup.sh demo` sets up only what the demo uses:
# .venv and the broker's and Spark's jars, not PySpark 4.3's environment nor the registry.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what="${1:-all}"
[[ "$what" == all || "$what" == demo ]] || { echo "setup: usage: ci/setup.sh [demo]" >&2; exit 2; }

for tool in python3 java mvn; do
  command -v "$tool" >/dev/null || { echo "setup: $tool is not on PATH" >&2; exit 1; }
done

if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi

versions=kafka_txn_sink/testing/versions.env
spark_version="$(sed -n 's/^SPARK_VERSION=//p' "$versions")"
[[ -n "$spark_version" ]] || { echo "setup: SPARK_VERSION missing in $versions" >&2; exit 1; }

# Re-install only when pyproject.toml or the pins changed since the last successful install.
stamp=.venv/.kts-installed
want="$(cat pyproject.toml "$versions" | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup: pip install -e '.[dev]' pyspark==$spark_version"
  # Compat mode puts the checkout on sys.path, so Spark's lookup of top-level pyspark_* modules
  # (pkgutil.iter_modules) finds pyspark_kafka_txn; the default editable finder hides it.
  .venv/bin/python -m pip install -q --disable-pip-version-check \
    --config-settings editable_mode=compat -e '.[dev]' \
    "pyspark==$spark_version"
  echo "$want" > "$stamp"
fi

if [[ "$what" == demo ]]; then
  echo "setup: resolving the broker's and Spark's jars (the demo's)"
  exec .venv/bin/python -m kafka_txn_sink.testing fetch
fi

ci/setup_spark_newest.sh

echo "setup: resolving the test bed's jars"
.venv/bin/python -m kafka_txn_sink.testing fetch --registry --prometheus
