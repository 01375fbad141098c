"""What the Avro schema tests share: a strict fastavro round trip and NaN-aware equality."""

from __future__ import annotations

import io
import math
from typing import Any

import fastavro
from hypothesis import HealthCheck, settings

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def roundtrip(schema: dict[str, Any], records: list[dict[str, Any]]) -> list[Any]:
    """Write `records` into an in-memory Avro file (strict) and read them back."""
    buffer = io.BytesIO()
    fastavro.writer(buffer, fastavro.parse_schema(schema), records, strict=True)
    buffer.seek(0)
    return list(fastavro.reader(buffer))


def same(a: Any, b: Any) -> bool:
    """Deep equality where NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
