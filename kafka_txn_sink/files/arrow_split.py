"""An Arrow batch split by partition directory, with Arrow compute: no Python object per row.

The rows are grouped (Arrow's hash group-by, in first-seen order) by their partition columns
and, with a time pattern, by their time floored to the finest unit the pattern prints, as a
wall-clock time in the partition's zone; only each group's key becomes Python values, which
`PartitionSpec.values_of` formats as the row path does. Groups naming the same directory (two
days of one `month=MM`) are merged, their rows kept in batch order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafka_txn_sink.files.partitioning import PartitionSpec, PartitionValues

_ROW = "__kafka_txn_sink_row"
_UNITS = (("s", "second"), ("m", "minute"), ("H", "hour"))


def split_batch(
    batch: pa.RecordBatch, spec: PartitionSpec
) -> list[tuple[PartitionValues, pa.Array | None]]:
    """The positions of the rows of `batch` per partition directory, in the order directories
    first appear (None: every row).

    Raises:
        InputError: the time column is null, or a value cannot name a directory.
    """
    keys = [batch.column(c) for c in spec.columns]
    if spec.time_column is not None:
        keys.append(_local_time(batch.column(spec.time_column), spec))
    if batch.num_rows == 0:
        return []
    if not keys:
        return [((), None)]
    names = [f"k{i}" for i in range(len(keys))]
    table = pa.table([*keys, pa.array(np.arange(batch.num_rows))], names=[*names, _ROW])
    groups = table.group_by(names, use_threads=False).aggregate([(_ROW, "list")])
    rows: dict[PartitionValues, list[pa.Array]] = {}
    for key, members in zip(
        zip(*(groups.column(n).to_pylist() for n in names), strict=True),
        groups.column(f"{_ROW}_list").combine_chunks(),
        strict=True,
    ):
        values = _values(spec, key)
        rows.setdefault(values, []).append(members.values)
    if len(rows) == 1:
        return [(next(iter(rows)), None)]
    return [(values, _in_order(members)) for values, members in rows.items()]


def _values(spec: PartitionSpec, key: Sequence[Any]) -> PartitionValues:
    if spec.time_column is None:
        return spec.values_of(key, None)
    time: datetime | None = key[-1]
    return spec.values_of(key[:-1], time)


def _in_order(members: list[pa.Array]) -> pa.Array:
    if len(members) == 1:
        return members[0]
    return pa.array(np.sort(np.concatenate([m.to_numpy() for m in members])))


def _local_time(times: pa.Array, spec: PartitionSpec) -> pa.Array:
    """Each time as a wall-clock time in the spec's zone, floored to what the pattern prints."""
    if not spec.time_ntz:
        if times.type.tz is None:  # an instant without a zone is UTC in Arrow
            times = times.cast(pa.timestamp(times.type.unit, "UTC"))
        times = pc.local_timestamp(times.cast(pa.timestamp(times.type.unit, spec.tz.key)))
    assert spec.time is not None
    letters = set().union(*(s.letters for s in spec.time.segments))
    unit = next((u for letter, u in _UNITS if letter in letters), "day")
    return pc.floor_temporal(times, unit=unit)
