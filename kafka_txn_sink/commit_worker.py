"""Whether Spark is building the writer for a batch's `commit()` or `abort()`.

PySpark builds a streaming query's writer twice per batch: in the planner, whose writer is sent
to the tasks, and again in the worker that runs the batch's `commit()` or `abort()` with the
tasks' messages (`pyspark.sql.worker.python_streaming_sink_runner`, in PySpark 4.0 to 4.3).
The second needs only what the commit and the abort use: the options and the driver's run. It
must not depend on what they do not use, the Schema Registry and the consumer group's member
check: a registry that does not answer, or a consumer that joined the group at that moment,
would otherwise leave the batch's prepared transactions open until the brokers' timeout.
"""

from __future__ import annotations

import sys

COMMIT_RUNNER = "python_streaming_sink_runner"


def building_for_commit() -> bool:
    """Whether the caller runs inside PySpark's commit/abort runner (its module on the stack,
    imported by Spark's worker daemon or run as `__main__`)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.rsplit(".", 1)[-1] == COMMIT_RUNNER or frame.f_code.co_filename.endswith(
            f"/{COMMIT_RUNNER}.py"
        ):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
