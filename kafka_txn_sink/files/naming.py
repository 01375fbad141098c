"""The names files mode gives what it stores under option `path`: built and parsed here only.

```
<partition path>/part-<batch>-<partition>-<attempt>-<seq>-<token>.avro   a data file
_schemas/<sha256 of the schema>.avsc                                      a stored schema
.<name>.<hex>.tmp              a local upload's temporary, beside <name>, renamed into it
```

A data file's name is unique per batch (10 digits or more), Spark partition (5), task attempt
(3), file of the attempt (`seq`, 5) and run (`token`, 8 random hex digits, against batch ids
that restart at 0 when a checkpoint is replaced). The verifier reads the attempt and token
back to tell a decided attempt's files from those of failed attempts; vacuum deletes only data
files (and their temporaries), never stored schemas.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass, field

SCHEMAS_DIR = "_schemas"
"""The directory under the sink's root where schemas too large to inline are stored."""

DATA_SUFFIX = ".avro"
"""The suffix of every data file."""

TEMP_PREFIX = "."
"""The first character of a local upload's temporary: listings of data skip such names."""

_DATA_FILE = re.compile(r"^part-(\d{10,})-(\d{5,})-(\d{3,})-(\d{5,})-([0-9a-f]+)\.avro$")
_TEMP = re.compile(r"^\.(.+)\.[0-9a-f]+\.tmp$")


@dataclass(frozen=True)
class FileName:
    """What a data file's name says: batch, Spark partition, attempt, file of the attempt,
    and the token of the run. `str()` gives the name (without directory)."""

    batch_id: int
    partition: int
    attempt: int
    seq: int
    token: str

    def __str__(self) -> str:
        return (
            f"part-{self.batch_id:010d}-{self.partition:05d}-{self.attempt:03d}-"
            f"{self.seq:05d}-{self.token}{DATA_SUFFIX}"
        )


def parse_file_name(name: str) -> FileName | None:
    """The batch, Spark partition, attempt and token in a data file's name, or in its local
    temporary's; `name` may carry directories or be a location. None: not a data file of ours.
    """
    base = base_name(name)
    match = _DATA_FILE.match(temp_target(base) or base)
    if match is None:
        return None
    batch, partition, attempt, seq = (int(match.group(i)) for i in range(1, 5))
    return FileName(batch, partition, attempt, seq, match.group(5))


@dataclass(frozen=True)
class FileNaming:
    """Names of one task attempt's files; `token` tells apart runs whose batch ids repeat."""

    batch_id: int
    partition: int
    attempt: int
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def file_name(self, seq: int) -> FileName:
        """The parts of the name of this attempt's file number `seq`."""
        return FileName(self.batch_id, self.partition, self.attempt, seq, self.token)

    def name(self, seq: int) -> str:
        """The name of this attempt's file number `seq` (without directory)."""
        return str(self.file_name(seq))

    def sync_marker(self, seq: int) -> bytes:
        """The Avro sync marker of file `seq`: a retry writing the same rows writes the same
        bytes."""
        # Not the attempt or token, which differ between retries.
        return hashlib.md5(
            f"kafka_txn_sink/{self.batch_id}/{self.partition}/{seq}".encode(), usedforsecurity=False
        ).digest()


def schema_file_name(digest: str) -> str:
    """The name a schema with this `schema_digest` is stored under."""
    return f"{SCHEMAS_DIR}/{digest}.avsc"


def is_schema_file(name: str) -> bool:
    """True for a name under `_schemas/` (relative to the sink's root)."""
    return name.startswith(f"{SCHEMAS_DIR}/")


def temp_name(name: str) -> str:
    """A fresh name for the temporary of a local upload of `name` (without directory)."""
    return f"{TEMP_PREFIX}{name}.{uuid.uuid4().hex[:12]}.tmp"


def temp_target(base: str) -> str | None:
    """The name a local upload's temporary (`base`, without directory) stands for; None when
    `base` is no such temporary."""
    match = _TEMP.match(base)
    return match.group(1) if match else None


def is_temp(name: str) -> bool:
    """True when `name` (relative to the sink's root) is a local upload's temporary."""
    return temp_target(base_name(name)) is not None


def is_data_file(name: str) -> bool:
    """True for a data file (`.avro`) or the temporary of one that a crash left behind: what
    vacuum may delete. Stored schemas and other hidden files are not data."""
    if is_schema_file(name):
        return False
    base = base_name(name)
    if base.startswith(TEMP_PREFIX):
        target = temp_target(base)
        return target is not None and target.endswith(DATA_SUFFIX)
    return base.endswith(DATA_SUFFIX)


def stored_name(partition_path: str, base: str) -> str:
    """The name of a file under the sink's root: its partition directory (if any), then `base`."""
    return f"{partition_path}/{base}" if partition_path else base


def base_name(name: str) -> str:
    """The last part of a name, path or location: the file's name without directories."""
    return name.rstrip("/").rpartition("/")[2]
