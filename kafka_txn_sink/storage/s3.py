"""Everything that needs boto3: one S3 bucket prefix behind one boto3 client, as the commit
log's storage (`S3Storage`) and as files mode's root (`S3FileSink`).

Only opening an `s3://` location imports this module, so a sink that keeps its commit log and
files on a local file system never loads boto3.

Every failed request becomes the owner's own error, naming the object and the endpoint and
never a credential; its HTTP status and S3 error code let callers read some answers as results
(412 on a conditional write, 404 on a read).
"""

from __future__ import annotations

import builtins
import contextlib
import random
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from kafka_txn_sink.errors import CommitLogError, StagingError
from kafka_txn_sink.storage.files import DEFAULT_MULTIPART_THRESHOLD, PendingUpload, StoredFile
from kafka_txn_sink.storage.settings import S3Settings

T = TypeVar("T")

_CONFLICT_RETRIES = 5
_CONFLICT_BACKOFF_S = 0.05
_MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest part but the last


def make_client(settings: S3Settings) -> Any:
    """A boto3 S3 client bounded by the settings' timeouts and attempts."""
    session = boto3.session.Session(
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        region_name=settings.region,
    )
    return session.client("s3", endpoint_url=settings.endpoint_url, config=_config(settings))


def _config(settings: S3Settings) -> Config:
    return Config(
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        retries={"total_max_attempts": settings.max_attempts, "mode": "standard"},
        s3={"addressing_style": "path"} if settings.use_path_style else None,
    )


class S3Prefix(ABC):
    """`s3://bucket/prefix`; names below it are keys relative to the prefix."""

    def __init__(self, bucket: str, prefix: str = "", settings: S3Settings | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = settings or S3Settings()
        self._client = make_client(self.settings)

    @abstractmethod
    def _error(self, message: str, status: int, code: str) -> Exception:
        """The owner's error for a failed request (status 0 when no answer came)."""

    @property
    def uri(self) -> str:
        """`s3://bucket/prefix` (`s3://bucket` for the whole bucket)."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def endpoint(self) -> str:
        """The endpoint the client talks to, as error messages name it."""
        return str(self._client.meta.endpoint_url)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _call(self, action: str, name: str, call: Callable[..., T], **arguments: Any) -> T:
        """Run one S3 call; every failure becomes `_error`, naming the object."""
        where = f"{self.uri}/{name}" if name else self.uri
        try:
            return call(**arguments)
        except ClientError as exc:
            raise self._refused(action, where, exc) from exc
        except S3UploadFailedError as exc:
            # boto3's transfer manager wraps the ClientError of a failed upload in this.
            cause = exc.__context__
            if isinstance(cause, ClientError):
                raise self._refused(action, where, cause) from exc
            raise self._failed(action, where, exc) from exc
        except BotoCoreError as exc:
            raise self._failed(action, where, exc) from exc

    def _ranged_get(self, name: str, size: int) -> Any:
        """S3's answer to a GET of the first `size` bytes of `name` (its `Body` unread)."""
        return self._call(
            "read",
            name,
            self._client.get_object,
            Bucket=self.bucket,
            Key=self._key(name),
            Range=f"bytes=0-{max(size, 1) - 1}",
        )

    def _refused(self, action: str, where: str, exc: ClientError) -> Exception:
        status, code = status_of(exc), code_of(exc)
        if code == "NoSuchBucket":
            return self._no_bucket(action, where)
        detail = exc.response.get("Error", {}).get("Message", "")
        message = f"cannot {action} {where}: HTTP {status} {code} {detail}".rstrip()
        return self._error(self._scrub(f"{message} (endpoint {self.endpoint})"), status, code)

    def _no_bucket(self, action: str, where: str) -> Exception:
        message = f"cannot {action} {where}: bucket {self.bucket!r} does not exist"
        return self._error(
            self._scrub(f"{message} (endpoint {self.endpoint})"), 404, "NoSuchBucket"
        )

    def _failed(self, action: str, where: str, exc: Exception) -> Exception:
        message = f"cannot {action} {where}: S3 endpoint {self.endpoint} failed: {exc}"
        return self._error(self._scrub(message), 0, "")

    def _scrub(self, message: str) -> str:
        secret = self.settings.secret_access_key
        return message.replace(secret, "***") if secret else message


def status_of(exc: ClientError) -> int:
    """The HTTP status of a refused request (0 if it carries none)."""
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def code_of(exc: ClientError) -> str:
    """The S3 error code of a refused request, such as `NoSuchKey` ('' if it carries none)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


# -- the commit log's storage ---------------------------------------------------------------


class S3Storage(S3Prefix):
    """A prefix of an S3 bucket, through boto3, on AWS or any S3-compatible endpoint."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        settings: S3Settings | None = None,
        *,
        list_page_size: int = 1000,
    ) -> None:
        super().__init__(bucket, prefix, settings)
        self.list_page_size = list_page_size

    def _error(self, message: str, status: int, code: str) -> S3RequestError:
        return S3RequestError(message, status, code)

    def __repr__(self) -> str:
        return f"S3Storage({self.uri!r}, endpoint={self.endpoint!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A boto3 client cannot be pickled; rebuild it where the storage lands (an executor).
        return (_rebuild_storage, (self.bucket, self.prefix, self.settings, self.list_page_size))

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """`PutObject` with `If-None-Match: *`; True: we created it, False: it existed."""
        key = self._key(name)
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                self._call(
                    "create",
                    name,
                    self._client.put_object,
                    Bucket=self.bucket,
                    Key=key,
                    Body=data,
                    IfNoneMatch="*",
                )
                return True
            except S3RequestError as refused:
                # A 412 may answer botocore's retry of our own first, successful attempt:
                # the caller reads the record back and compares.
                if refused.status == 412:
                    return False
                # 409: a concurrent conditional write to the same key is in flight; its outcome
                # decides, so ask again shortly.
                if refused.status != 409 or attempt == _CONFLICT_RETRIES:
                    raise
                time.sleep(_CONFLICT_BACKOFF_S * 2**attempt * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def get(self, name: str) -> bytes | None:
        """The object's bytes, or None if there is no such key."""
        try:
            response = self._call(
                "read", name, self._client.get_object, Bucket=self.bucket, Key=self._key(name)
            )
        except S3RequestError as refused:
            if refused.code in ("NoSuchKey", "404"):
                return None
            raise
        return self._call("read", name, response["Body"].read)

    def exists(self, name: str) -> bool:
        """Whether the key exists, by a one-byte GET of the key itself: never a listing, which
        may lag a write on some stores. A missing bucket is an error, not False.

        Raises:
            S3RequestError: the bucket does not exist, or S3 refused or did not answer.
        """
        try:
            response = self._ranged_get(name, 1)
        except S3RequestError as refused:
            if refused.code == "NoSuchKey" or refused.status == 416:  # 416: an empty object
                return refused.status == 416
            if refused.status != 404 or refused.code == "NoSuchBucket":
                raise
            # A 404 without S3's error code (a proxy, a HEAD-like answer) does not say which
            # is missing: the key, or the bucket.
            self._check_bucket("read", name)
            return False
        response["Body"].close()
        return True

    def _check_bucket(self, action: str, name: str) -> None:
        """Raise the missing bucket's error if a HEAD of the bucket answers 404."""
        try:
            self._call(action, name, self._client.head_bucket, Bucket=self.bucket)
        except S3RequestError as refused:
            if refused.status == 404:
                raise self._no_bucket(action, f"{self.uri}/{name}") from refused
            raise

    def put(self, name: str, data: bytes) -> None:
        """Plain overwrite: only for best-effort data such as hints."""
        self._call(
            "write",
            name,
            self._client.put_object,
            Bucket=self.bucket,
            Key=self._key(name),
            Body=data,
        )

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """Every name starting with `prefix` and sorting after `start_after`, sorted."""
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if start_after is not None:
            arguments["StartAfter"] = self._key(start_after)
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(**arguments, PaginationConfig={"PageSize": self.list_page_size})
        keys = self._call("list", prefix, _keys_of, pages=pages)
        skip = len(self._key(""))
        return sorted(key[skip:] for key in keys)

    def delete(self, name: str) -> None:
        """Remove the key; a missing one is no error (S3 answers 204 either way)."""
        self._call(
            "delete", name, self._client.delete_object, Bucket=self.bucket, Key=self._key(name)
        )

    def probe_conditional_writes(self) -> None:
        """Fail unless the endpoint refuses a second `If-None-Match: *` write of one key."""
        name = f"_probe/{uuid.uuid4().hex}"
        try:
            first = self.put_if_absent(name, b"probe")
            second = self.put_if_absent(name, b"probe again") if first else True
        except S3RequestError as exc:
            if exc.status in (400, 501):
                raise self._not_honoured(f"it rejected the header: {exc}") from exc
            raise
        finally:
            self._delete_quietly(name)
        if not first:
            raise self._not_honoured("a fresh key was reported as existing")
        if second:
            raise self._not_honoured("a second write of the same key succeeded")

    def _not_honoured(self, why: str) -> CommitLogError:
        return CommitLogError(
            f"S3 endpoint {self.endpoint} does not honour If-None-Match ({why}) for {self.uri}; "
            "conditional writes are required for exactly-once"
        )

    def _delete_quietly(self, name: str) -> None:
        with contextlib.suppress(CommitLogError):
            self.delete(name)


class S3RequestError(CommitLogError):
    """S3 answered a request with an error (status 0: no answer); status and code let callers
    treat some answers as results."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _keys_of(pages: Iterable[dict[str, Any]]) -> list[str]:
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _rebuild_storage(bucket: str, prefix: str, settings: S3Settings, page_size: int) -> S3Storage:
    return S3Storage(bucket, prefix, settings, list_page_size=page_size)


# -- files mode's root ----------------------------------------------------------------------


class S3FileSink(S3Prefix):
    """A prefix of an S3 bucket, through boto3 (AWS or any S3-compatible endpoint).

    Files at or above `multipart_threshold` bytes go up as multipart uploads in parts of that
    size (at least 5 MiB); smaller ones in one PUT. Each request is bounded by the settings'
    timeouts and attempts, so a hung endpoint fails the upload in bounded time.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        settings: S3Settings | None = None,
        *,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        max_concurrency: int = 4,
    ) -> None:
        if multipart_threshold < _MIN_PART_SIZE:
            raise StagingError(
                f"multipart threshold {multipart_threshold} is below S3's smallest part "
                f"({_MIN_PART_SIZE} bytes)"
            )
        super().__init__(bucket, prefix, settings)
        self.multipart_threshold = multipart_threshold
        self.max_concurrency = max_concurrency
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_threshold,
            max_concurrency=max_concurrency,
        )

    def _error(self, message: str, status: int, code: str) -> S3FileError:
        return S3FileError(message, status, code)

    def __repr__(self) -> str:
        return f"S3FileSink({self.uri!r}, endpoint={self.endpoint!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A boto3 client cannot be pickled; rebuild it where the sink lands (an executor).
        return (
            _rebuild_file_sink,
            (
                self.bucket,
                self.prefix,
                self.settings,
                self.multipart_threshold,
                self.max_concurrency,
            ),
        )

    def location(self, name: str) -> str:
        """`s3://bucket/key` of `name`."""
        return f"s3://{self.bucket}/{self._key(name)}"

    def upload(self, local: Path, name: str) -> str:
        """One PUT, or a multipart upload from `multipart_threshold` bytes; atomic either way."""
        self._call(
            "upload",
            name,
            self._client.upload_file,
            Filename=str(local),
            Bucket=self.bucket,
            Key=self._key(name),
            Config=self._transfer,
        )
        return self.location(name)

    def put_text(self, name: str, text: str) -> bool:
        """Create `name` holding `text` with `If-None-Match: *` (True: created)."""
        try:
            self._call(
                "write",
                name,
                self._client.put_object,
                Bucket=self.bucket,
                Key=self._key(name),
                Body=text.encode("utf-8"),
                IfNoneMatch="*",
            )
        except S3FileError as refused:
            # 412: it exists (perhaps from botocore's retry of our own first attempt).
            # 409: a concurrent put-if-absent of the same content-addressed name.
            if refused.status in (409, 412):
                return False
            raise
        return True

    def list(self, prefix: str = "") -> list[StoredFile]:
        """Every object whose name starts with `prefix`, sorted by name."""
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        skip = len(self._key(""))
        items = self._call("list", prefix, _items_of, pages=pages)
        found = [
            StoredFile(item["Key"][skip:], int(item["Size"]), item["LastModified"].timestamp())
            for item in items
        ]
        return sorted(found, key=lambda f: f.name)

    def read_head(self, name: str, size: int) -> bytes:
        """The first `size` bytes of `name`, by a ranged GET."""
        response = self._ranged_get(name, size)
        return bytes(self._call("read", name, response["Body"].read))

    def delete(self, name: str) -> None:
        """Remove `name`; a missing object is no error."""
        self._call(
            "delete", name, self._client.delete_object, Bucket=self.bucket, Key=self._key(name)
        )

    def pending_uploads(self, prefix: str = "") -> builtins.list[PendingUpload]:
        """Multipart uploads under `prefix` that were never completed nor aborted."""
        paginator = self._client.get_paginator("list_multipart_uploads")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        skip = len(self._key(""))
        uploads = self._call("list uploads of", prefix, _uploads_of, pages=pages)
        found = [
            PendingUpload(u["Key"][skip:], u["UploadId"], u["Initiated"].timestamp())
            for u in uploads
        ]
        return sorted(found, key=lambda u: (u.name, u.initiated_s))

    def abort_upload(self, upload: PendingUpload) -> None:
        """Abort a pending multipart upload; an unknown one (already gone) is no error."""
        try:
            self._call(
                "abort the upload of",
                upload.name,
                self._client.abort_multipart_upload,
                Bucket=self.bucket,
                Key=self._key(upload.name),
                UploadId=upload.upload_id,
            )
        except S3FileError as refused:
            if refused.status != 404:
                raise


class S3FileError(StagingError):
    """S3 answered a request with an error (status 0: no answer)."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _items_of(pages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for page in pages for item in page.get("Contents", [])]


def _uploads_of(pages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [upload for page in pages for upload in page.get("Uploads", [])]


def _rebuild_file_sink(
    bucket: str, prefix: str, settings: S3Settings, threshold: int, concurrency: int
) -> S3FileSink:
    return S3FileSink(
        bucket, prefix, settings, multipart_threshold=threshold, max_concurrency=concurrency
    )
