#!/usr/bin/env bash
# The last steps of each pytest-xdist process of a failed run, from execnet's channel traces
# (EXECNET_DEBUG=1 makes each write $TMPDIR/execnet-debug-PID): a worker that died without a
# word shows here whether it was told to stop, lost its channel, or simply ended (a trace that
# stops mid-work, after no "terminating", is a SIGKILL: the kernel's last lines follow). The scripts
# that run pytest call it on a failure:
#   ci/worker_traces.sh MARKER   (MARKER: a file made when the run started)
set -uo pipefail
marker=${1:?usage: ci/worker_traces.sh MARKER}
find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'execnet-debug-*' -newer "$marker" -print0 |
  while IFS= read -r -d '' trace; do
    echo "-- $trace (last 12 lines)"
    tail -12 "$trace"
  done
echo "-- the kernel's last lines"
dmesg 2>/dev/null | grep -v -E 'drop_caches' | tail -5
exit 0
