#!/usr/bin/env bash
# The wheel a user installs, checked from outside the checkout:
#  1. build it (pip wheel --no-deps) from a copy of the tracked and new files (no stale build/),
#     C extension included (CPython's stable ABI), and tag it manylinux;
#  2. "user": a clean venv with the wheel and its extras `spark` and `testing`, PySpark pinned to
#     SPARK_VERSION of versions.env, pytest, pytest-xdist (step 4's writes run two at a time)
#     and chispa. There: `kafka-txn-sink --help` and every subcommand's, then the tests of
#     examples/testkit and examples/databricks (orders_job.py run by spark-submit) from a
#     directory outside the checkout, the test kit's fixtures coming from the wheel's pytest11
#     entry point;
#  3. "platform": the wheel without extras in a venv with no PySpark, where the CLI must work;
#     then that venv given a platform's PySpark (on sys.path, no pip distribution, as on
#     Databricks): installing the wheel leaves that PySpark as it was, and the sink imports;
#  4. "combinations": a clean venv for each install a user would choose (core, core+files,
#     core+delta, core+s3, all), its installed size printed (MB, and beyond pyarrow), each given
#     the user venv's PySpark on sys.path; then one batch write in each, in the mode it is for
#     (ci/wheel/test_combinations.py, one broker and one S3 server for all), and the core
#     install refusing an s3:// commitLog at the driver's start with the s3 extra's pip line.
# pip's cache is reused; every step is bounded. A broker or S3 endpoint in KTS_KAFKA_BOOTSTRAP /
# KTS_S3_ENDPOINT is used by the example tests; otherwise they start their own.
# KTS_KEEP_WHEEL_CHECK=1 keeps the work directory (printed at the start).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
python=${PYTHON:-python3}
spark_version="$(sed -n 's/^SPARK_VERSION=//p' kafka_txn_sink/testing/versions.env)"
[[ -n "$spark_version" ]] || { echo "check_wheel: SPARK_VERSION missing" >&2; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/kts-wheel-check.XXXXXX")"
if [[ "${KTS_KEEP_WHEEL_CHECK:-}" != 1 ]]; then
  trap 'rm -rf "$work"' EXIT
fi
echo "check_wheel: working in $work"

# step SECONDS NAME COMMAND...: run COMMAND (a program or a function below) within SECONDS, in
# a child bash with errexit, and print how long it took.
step() {
  local limit=$1 name=$2 started=$SECONDS
  shift 2
  echo "== $name"
  timeout --kill-after=30 "$limit" bash -euo pipefail -c '"$@"' step "$@"
  echo "   $name: $((SECONDS - started)) s"
}

copy_sources() {
  mkdir -p "$work/src"
  git ls-files --cached --others --exclude-standard \
    | while IFS= read -r file; do [[ -e "$file" ]] && printf '%s\n' "$file"; done \
    | tar -cf - -T - | tar -xf - -C "$work/src"
}

# Every command path of the CLI (`log list`, `status`, ...), from its argparse tree.
list_commands() {
  "$1" - <<'EOF'
import argparse

from kafka_txn_sink.cli import build_parser


def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                print(" ".join([*path, name]))
                walk(sub, [*path, name])


walk(build_parser(), [])
EOF
}

check_help() {
  local venv=$1 commands
  "$venv/bin/kafka-txn-sink" --help >/dev/null
  commands="$(list_commands "$venv/bin/python")"
  [[ -n "$commands" ]] || { echo "check_wheel: the CLI lists no command" >&2; return 1; }
  while IFS= read -r command; do
    # shellcheck disable=SC2086  # a command path is words
    "$venv/bin/kafka-txn-sink" $command --help >/dev/null
    echo "   kafka-txn-sink $command --help: ok"
  done <<< "$commands"
}

run_examples() {
  local venv=$1
  mkdir -p "$work/examples"
  cp -r examples/testkit examples/databricks "$work/examples/"
  rm -rf "$work/examples"/*/dist "$work/examples"/*/__pycache__
  (
    cd "$work/examples"
    "$venv/bin/python" - "$root" <<'EOF'
import sys
from pathlib import Path

import kafka_txn_sink

where = Path(kafka_txn_sink.__file__).resolve()
assert Path(sys.argv[1]).resolve() not in where.parents, f"imported from the checkout: {where}"
print(f"   kafka_txn_sink {kafka_txn_sink.__version__} from {where.parent}")

from confluent_kafka import Producer

from kafka_txn_sink.kafka.quiet import quiet_produce

# The wheel's C loop (kafka/_quiet.c) is built and binds to confluent-kafka's librdkafka.
assert quiet_produce(Producer({"bootstrap.servers": "127.0.0.1:9"})) is not None, "no C loop"
print("   the C loop for records without reports: built and bound")
EOF
    "$venv/bin/python" -m pytest -q -p no:cacheprovider testkit databricks
  )
}

check_platform_pyspark() {
  local user=$1 venv="$work/platform" platform="$work/platform-pyspark" site
  mkdir -p "$platform"
  site="$("$user/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  ln -s "$site/pyspark" "$platform/pyspark"
  ln -s "$site/py4j" "$platform/py4j"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "$wheel"
  if "$venv/bin/python" -m pip show -q pyspark 2>/dev/null; then
    echo "check_wheel: installing the wheel without extras installed pyspark" >&2
    return 1
  fi
  # No PySpark at all yet: the command line works without it.
  if "$venv/bin/python" -c 'import pyspark' 2>/dev/null; then
    echo "check_wheel: pyspark importable in a venv that should have none" >&2
    return 1
  fi
  check_help "$venv"
  # Now the platform's PySpark, on sys.path as Databricks has it, then the wheel again.
  echo "$platform" > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/platform_pyspark.pth"
  "$venv/bin/python" -m pip uninstall -q -y kafka-txn-sink
  "$venv/bin/python" -m pip install -q "$wheel"
  "$venv/bin/python" -m pip check
  if "$venv/bin/python" -m pip show -q pyspark 2>/dev/null; then
    echo "check_wheel: installing the wheel installed a pyspark over the platform's" >&2
    return 1
  fi
  "$venv/bin/python" - "$platform" <<'EOF'
import sys
from pathlib import Path

import pyspark

import kafka_txn_sink.datasource  # noqa: F401  (the sink, on the platform's PySpark)

where = Path(pyspark.__file__).parent
assert where == Path(sys.argv[1]) / "pyspark", f"pyspark comes from {where}"
print(f"   pyspark {pyspark.__version__} still the platform's ({where}); the sink imports")
EOF
  "$venv/bin/kafka-txn-sink" --help >/dev/null
}

# The installed size of a venv: site-packages less pip and setuptools, and beyond pyarrow. Only
# what is there is subtracted: grpcio-tools (the protobuf extra) pulls a setuptools without
# pkg_resources, and `du` of a missing path failed the step under pipefail. The biggest five are
# taken by awk reading every line, so no `head` closes the pipe early.
print_size() {
  local name=$1 site=$2 total pyarrow tool
  total="$(du -smc "$site"/* | tail -1 | cut -f1)"
  for tool in pip setuptools pkg_resources; do  # setuptools 81+ has no pkg_resources
    if [[ -e "$site/$tool" ]]; then total=$((total - $(du -sm "$site/$tool" | cut -f1))); fi
  done
  pyarrow="$(du -sm "$site/pyarrow" | cut -f1)"
  echo "   $name: $total MB installed, $((total - pyarrow)) MB beyond pyarrow; biggest:" \
    "$(du -sm "$site"/* | sort -rn | grep -v -E '/(pip|setuptools)$' \
      | awk 'NR <= 5 {n=split($2, p, "/"); printf "%s %s MB, ", p[n], $1}')"
}

install_combination() {
  local combination=$1 spec="$wheel[$1]"
  [[ "$combination" == core ]] && spec="$wheel"
  "$python" -m venv "$work/c-$combination"
  "$work/c-$combination/bin/python" -m pip install -q "$spec"
}

make_combinations() {
  local user=$1 pyspark="$work/combination-pyspark" site combination pythons="" pids=()
  mkdir -p "$pyspark"
  site="$("$user/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  ln -sfn "$site/pyspark" "$pyspark/pyspark"
  ln -sfn "$site/py4j" "$pyspark/py4j"
  for combination in core files delta s3 all; do  # side by side: mostly unpacking from cache
    install_combination "$combination" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  for combination in core files delta s3 all; do
    site="$("$work/c-$combination/bin/python" -c \
      'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    print_size "$combination" "$site"
    echo "$pyspark" > "$site/platform_pyspark.pth"  # after the size: PySpark is the platform's
    pythons+="${pythons:+,}$combination=$work/c-$combination/bin/python"
  done
  echo "$pythons" > "$work/combinations"
}

run_combinations() {
  local user=$1
  mkdir -p "$work/wheel-tests"
  cp ci/wheel/query.py ci/wheel/test_combinations.py "$work/wheel-tests/"
  (
    cd "$work/wheel-tests"
    KTS_COMBINATIONS="$(cat "$work/combinations")" \
      "$user/bin/python" -m pytest -q -s -p no:cacheprovider -n 2 test_combinations.py
  )
}

export -f copy_sources list_commands check_help run_examples check_platform_pyspark
export -f print_size install_combination make_combinations run_combinations
export work root python
step 300 "copy the sources" copy_sources
step 600 "build the wheel" "$python" -m pip wheel -q --no-deps --wheel-dir "$work/built" "$work/src"
# The C extension needs no shared library but glibc's (it calls CPython's stable ABI, resolved in
# the interpreter, and librdkafka by addresses it is given): checked, then the wheel is tagged
# manylinux2014.
manylinux() {
  local built so
  built="$(ls "$work"/built/kafka_txn_sink-*-abi3-linux_x86_64.whl)"
  mkdir -p "$work/so" "$work/dist"
  (cd "$work/so" && "$python" -m zipfile -e "$built" .)
  so="$(ls "$work"/so/kafka_txn_sink/kafka/_quiet*.so)"
  if readelf -d "$so" | grep NEEDED | grep -v -F '[libc.so.6]'; then
    echo "check_wheel: $so needs a shared library beyond glibc (above)" >&2
    return 1
  fi
  cp "$built" "$work/dist/"
  "$root/.venv/bin/python" -m wheel tags --remove \
    --platform-tag manylinux_2_17_x86_64.manylinux2014_x86_64 "$work"/dist/*.whl
}
export -f manylinux
step 300 "the C extension needs no library; tag the wheel manylinux" manylinux
wheel="$(ls "$work"/dist/kafka_txn_sink-*manylinux*.whl)"
export wheel
echo "   $wheel"

step 120 "user venv" "$python" -m venv "$work/user"
step 900 "install the wheel [spark,testing], pyspark==$spark_version, pytest, pytest-xdist, chispa" \
  "$work/user/bin/python" -m pip install -q "$wheel[spark,testing]" "pyspark==$spark_version" \
  pytest pytest-xdist chispa
step 300 "kafka-txn-sink --help and every subcommand's" check_help "$work/user"
step 1800 "examples/testkit and examples/databricks from the wheel" run_examples "$work/user"
step 900 "no PySpark: the CLI; a platform's PySpark stays as it was" check_platform_pyspark "$work/user"
step 900 "install each combination: core, files, delta, s3, all" make_combinations "$work/user"
step 900 "one batch write with each combination; core refuses s3:// by its extra" \
  run_combinations "$work/user"
echo "check_wheel: ok"
