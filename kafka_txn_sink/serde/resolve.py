"""The driver's part of the record formats: each schema id resolved once, before any task.

For each of `key` and `value` written as `avro`, `json-schema` or `protobuf` the driver takes
the schema (the user's `keySchema`/`valueSchema`, one derived from the column's Spark type (not
for protobuf), or with `useLatestVersion` the subject's latest), finds its subject
(`keySubject`/`valueSubject`, or the strategy's name), and gets its id from the registry:
registering it when `autoRegisterSchemas` allows (the registry checks compatibility), else
looking it up. Any refusal fails the batch
here, before a transaction opens, naming the subject, the registry and what it answered. The
tasks get the ids and schemas in their plan (`Encoding`, with a `.proto` compiled) and never
call the registry.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.types import DataType, StructField, StructType

from kafka_txn_sink.errors import ConfigError, SchemaRegistryError
from kafka_txn_sink.protocol.messages import SchemaUse
from kafka_txn_sink.redaction import scrubbed
from kafka_txn_sink.serde.options import (
    AUTO_REGISTER,
    REGISTRY_PREFIX,
    SUBJECT_NAME_STRATEGY,
    USE_LATEST_VERSION,
    FieldFormat,
    Format,
    SerdeOptions,
)
from kafka_txn_sink.serde.protobuf import FIRST_MESSAGE

# The registry client's deadlines unless the user sets them: a start waits at most about
# (1 + retries) x timeout for each call.
CLIENT_DEFAULTS = {"timeout": 10, "max.retries": 2}
# The client's settings that are numbers, and the TLS files it reads when it is made.
_NUMERIC_SETTINGS = frozenset(
    {
        "timeout",
        "cache.capacity",
        "cache.latest.ttl.sec",
        "max.retries",
        "retries.wait.ms",
        "retries.max.wait.ms",
    }
)
_TLS_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")
_TYPES: Mapping[Format, str] = {"avro": "AVRO", "json-schema": "JSON", "protobuf": "PROTOBUF"}


@dataclass(frozen=True)
class Encoding:
    """How the tasks write one column: its format, and the schema and id the driver resolved."""

    column: str  # "key" or "value"
    format: Format
    subject: str
    schema_id: int
    schema: str  # the schema text the id names
    data_type: DataType  # the column's Spark type
    descriptor: bytes = b""  # protobuf: the schema compiled (serde/protobuf.py), else empty

    @property
    def prefix(self) -> bytes:
        """Confluent's wire format before the payload: magic byte 0, the id (big-endian), and
        for protobuf the message indexes of the first message."""
        indexes = FIRST_MESSAGE if self.format == "protobuf" else b""
        return b"\x00" + self.schema_id.to_bytes(4, "big") + indexes


@dataclass(frozen=True)
class Encodings:
    """The resolved encodings of the key and the value (None: written raw)."""

    key: Encoding | None = None
    value: Encoding | None = None


def resolve(serde: SerdeOptions, schema: StructType, topic: str | None) -> Encodings | None:
    """Resolve the schema ids of the columns written against the registry; None when both are
    raw. `topic` is option topic (None: rows name their topics).

    Raises:
        ConfigError: a schema option does not parse, or no subject can be named.
        SchemaRegistryError: the registry cannot be reached or refuses the schema; nothing is
            written.
    """
    if not serde.uses_registry:
        return None
    connect = functools.cache(lambda: registry_client(serde.registry))  # after the checks
    types = {f.name.lower(): f.dataType for f in schema.fields}
    found = {f.column: _resolve_field(connect, serde, f, types, topic) for f in serde.fields()}
    return Encodings(key=found.get("key"), value=found.get("value"))


def pinned(
    serde: SerdeOptions, schema: StructType, uses: Sequence[SchemaUse], resolved: Encodings | None
) -> Encodings | None:
    """The encodings of a replay that repairs a decided batch: each column written with the
    schema id the batch's decision recorded (`uses`), whatever its subject's latest version is
    now, since a repair takes only records equal to the lost ones and the id is in each. A
    column the decision recorded no schema for, or in another format (the options changed),
    keeps its `resolved` encoding (such a replay's records differ; the repair refuses them).

    Raises:
        SchemaRegistryError: the registry does not answer, or no longer holds the id.
    """
    if resolved is None or not uses:
        return resolved
    connect = functools.cache(lambda: registry_client(serde.registry))
    url = serde.registry.get("url", "")
    recorded = {u.column: u for u in uses}
    found = {}
    for encoding in filter(None, (resolved.key, resolved.value)):
        use = recorded.get(encoding.column)
        if use is None or use.format != encoding.format or use.schema_id == encoding.schema_id:
            continue  # the resolved encoding stands
        text = _call(connect().get_schema, use.schema_id, url=url, subject=use.subject).schema_str
        what = f"schema id {use.schema_id} of subject {use.subject!r}, which the decision recorded"
        found[encoding.column] = replace(
            encoding,
            subject=use.subject,
            schema_id=use.schema_id,
            schema=text,
            descriptor=_descriptor(text, encoding.format, what),
        )
    return Encodings(key=found.get("key", resolved.key), value=found.get("value", resolved.value))


def schema_uses(encodings: Encodings | None) -> tuple[SchemaUse, ...]:
    """What a batch's decision records of `encodings`: each column's subject and schema id."""
    found = (encodings.key, encodings.value) if encodings else ()
    return tuple(SchemaUse(e.column, e.format, e.subject, e.schema_id) for e in found if e)


def derived_schema(column: str, data_type: DataType, fmt: Format) -> str:
    """The schema of a column of `data_type` when the user gives none: Avro as files mode maps
    Spark types (a struct is the record `Key` or `Value`), or a JSON Schema.

    Raises:
        ConfigError: for protobuf, whose schema is the user's.
    """
    if fmt == "protobuf":
        raise ConfigError(f"option {column}Schema is required with {column}Format=protobuf")
    if fmt == "avro":
        from kafka_txn_sink.files.spark_avro import spark_to_avro

        name = column.capitalize()
        if isinstance(data_type, StructType):
            return json.dumps(spark_to_avro(data_type, name=name))
        wrapper = StructType([StructField(column, data_type, nullable=False)])
        return json.dumps(spark_to_avro(wrapper, name=name)["fields"][0]["type"])
    from kafka_txn_sink.serde.spark_json import spark_to_json_schema

    return json.dumps(spark_to_json_schema(data_type, title=column.capitalize()))


def _resolve_field(
    connect: Callable[[], Any],
    serde: SerdeOptions,
    field: FieldFormat,
    types: Mapping[str, DataType],
    topic: str | None,
) -> Encoding:
    data_type = types.get(field.column)
    if data_type is None:
        raise ConfigError(
            f"option {field.column}Format={field.format} names column {field.column}, which "
            f"the input does not have"
        )
    if field.format == "protobuf" and not isinstance(data_type, StructType):
        raise ConfigError(
            f"option {field.column}Format=protobuf needs column {field.column} to be a struct "
            f"(the message's fields), not {data_type.simpleString()}"
        )
    url = serde.registry.get("url", "")
    if serde.use_latest:
        subject = field.subject or _subject(serde, field, topic, None)
        client = connect()
        latest = _call(client.get_latest_version, subject, url=url, subject=subject)
        text = latest.schema.schema_str
        _check_type(latest.schema.schema_type, field, subject)
        descriptor = _descriptor(
            text,
            field.format,
            f"the latest schema of subject {subject!r} ({USE_LATEST_VERSION}=true)",
        )
        _check_proto_types(descriptor, data_type, f"the latest schema of subject {subject!r}")
        return Encoding(
            field.column, field.format, subject, latest.schema_id, text, data_type, descriptor
        )
    text = field.schema or derived_schema(field.column, data_type, field.format)
    descriptor = _check_schema_text(text, field)
    _check_proto_types(descriptor, data_type, f"option {field.column}Schema")
    subject = field.subject or _subject(serde, field, topic, text)
    schema = _schema(text, field.format)
    client = connect()
    if serde.auto_register:
        schema_id = _call(client.register_schema, subject, schema, url=url, subject=subject)
    else:
        schema_id = _looked_up(client, subject, schema, url)
    return Encoding(
        field.column, field.format, subject, int(schema_id), text, data_type, descriptor
    )


def _check_proto_types(descriptor: bytes, data_type: DataType, schema: str) -> None:
    """A protobuf column's string and binary fields match the message's string and bytes.

    Raises:
        ConfigError: naming the fields and the schema.
    """
    if not descriptor:
        return
    from kafka_txn_sink.serde.protobuf import type_mismatches

    found = type_mismatches(descriptor, data_type)
    if found:
        raise ConfigError(
            f"{schema} does not fit the column's type: {'; '.join(found)} (cast the column: "
            f"protobuf's JSON mapping would take one for the other silently)"
        )


def _descriptor(text: str, fmt: Format, what: str) -> bytes:
    """The compiled `.proto` of a protobuf schema from the registry (`what` names it); nothing
    for the other formats."""
    if fmt != "protobuf":
        return b""
    from kafka_txn_sink.serde.protobuf import ProtoSchemaError, compile_proto

    try:
        return compile_proto(text)
    except ProtoSchemaError as exc:
        raise SchemaRegistryError(f"{what} is not a .proto text protoc compiles: {exc}") from None


def _looked_up(client: Any, subject: str, schema: Any, url: str) -> int:
    """The id of `schema` under `subject`, which must hold it already."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

    try:
        return int(client.lookup_schema(subject, schema).schema_id)
    except ClientError as exc:
        if exc.http_status_code != 404:
            raise _failed(exc, url, subject) from None
        compatible = _compatibility(client, subject, schema)
        raise _registry_error(
            f"subject {subject!r} of the Schema Registry {url} does not hold the schema and "
            f"option {AUTO_REGISTER}=false: {compatible}. Register the schema under the "
            f"subject, or let the sink register it ({exc.error_message}, HTTP 404, error "
            f"code {exc.error_code}); nothing was written"
        ) from None
    except Exception as exc:  # unreachable, timed out, refused TLS: no answer
        raise _failed(exc, url, subject) from None


def _compatibility(client: Any, subject: str, schema: Any) -> str:
    """What the registry says of `schema` against `subject`'s latest version, for messages."""
    try:
        if client.test_compatibility(subject, schema):
            return "it is compatible with the subject's latest version"
        return "it is NOT compatible with the subject's latest version"
    except Exception:  # only for the message: a subject without versions has nothing to compare
        return "the subject has no version to compare it with"


def _subject(serde: SerdeOptions, field: FieldFormat, topic: str | None, text: str | None) -> str:
    """The subject the strategy names for `field` (its schema's text when it is known)."""
    if serde.strategy == "topic":
        if topic is None:
            raise ConfigError(
                f"option {field.column}Subject is required with {SUBJECT_NAME_STRATEGY}=topic "
                f"when rows name their topics (no option topic): the subject cannot depend on "
                f"the row"
            )
        return f"{topic}-{field.column}"
    full_name = _record_name(text, field) if text is not None else None
    if full_name is None:
        raise ConfigError(
            f"option {SUBJECT_NAME_STRATEGY}={serde.strategy} needs a named schema for column "
            f"{field.column} (an Avro record, a JSON Schema with a title, or a protobuf "
            f"message); with "
            f"{USE_LATEST_VERSION} give option {field.column}Subject"
        )
    if serde.strategy == "record":
        return full_name
    if topic is None:
        raise ConfigError(
            f"option {SUBJECT_NAME_STRATEGY}=topic_record needs option topic, or option "
            f"{field.column}Subject"
        )
    return f"{topic}-{full_name}"


def _record_name(text: str, field: FieldFormat) -> str | None:
    if field.format == "protobuf":
        from kafka_txn_sink.serde.protobuf import full_name

        return full_name(text)  # compiled already (_check_schema_text): cached
    body = json.loads(text)
    if not isinstance(body, dict):
        return None
    if field.format == "json-schema":
        title = body.get("title")
        return title if isinstance(title, str) else None
    if body.get("type") != "record" or "name" not in body:
        return None
    name, namespace = str(body["name"]), body.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _check_schema_text(text: str, field: FieldFormat) -> bytes:
    """The schema parses as its format's; for protobuf, the compiled `.proto` (else empty).

    Raises:
        ConfigError: naming the option and what the parser (or protoc) said.
    """
    option = f"{field.column}Schema"
    try:
        if field.format == "protobuf":
            from kafka_txn_sink.serde.protobuf import compile_proto

            return compile_proto(text)
        body = json.loads(text)
        if field.format == "avro":
            import fastavro

            fastavro.parse_schema(body)
        else:
            from jsonschema.validators import validator_for

            validator_for(body).check_schema(body)
    except Exception as exc:  # any parser's refusal is the user's schema's fault
        raise ConfigError(
            f"option {option} is not a valid {field.format} schema: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    return b""


def _check_type(schema_type: str | None, field: FieldFormat, subject: str) -> None:
    found = schema_type or "AVRO"
    if found != _TYPES[field.format]:
        raise SchemaRegistryError(
            f"the latest schema of subject {subject!r} is {found}, but option "
            f"{field.column}Format is {field.format} ({USE_LATEST_VERSION}=true)"
        )


def _schema(text: str, fmt: Format) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(text, _TYPES[fmt])


def registry_client(settings: Mapping[str, str]) -> Any:
    """confluent-kafka's registry client with the user's settings and bounded deadlines.

    Raises:
        ConfigError: a setting the client does not know (named with its prefix), or a TLS file
            it cannot read (missing, not PEM, a wrong key password).
    """
    from confluent_kafka.schema_registry import SchemaRegistryClient

    # Options are strings; the client wants numbers for its deadlines, retries and caches, and
    # text for the rest (a token or a key password of digits only included).
    numbers = {k: int(v) for k, v in settings.items() if k in _NUMERIC_SETTINGS and v.isdigit()}
    conf: dict[str, int | str] = {**CLIENT_DEFAULTS, **settings, **numbers}
    try:
        return SchemaRegistryClient(conf)
    except (ValueError, TypeError) as exc:  # "Invalid url <url>" among them
        message = f"the {REGISTRY_PREFIX}* options do not fit the Schema Registry client: {exc}"
        raise ConfigError(scrubbed(message)) from None
    except OSError as exc:  # ssl.SSLError too; names the files, never the key password
        given = (f"{REGISTRY_PREFIX}{k}={settings[k]}" for k in _TLS_FILES if k in settings)
        files = ", ".join(given)
        message = (
            f"the Schema Registry client cannot read its TLS files ({files}): "
            f"{type(exc).__name__}: {exc}"
        )
        raise ConfigError(scrubbed(message)) from None


def _call(method: Any, *args: Any, url: str, subject: str) -> Any:
    try:
        return method(*args)
    except Exception as exc:  # the registry's refusal, or no answer at all
        raise _failed(exc, url, subject) from None


def _failed(exc: Exception, url: str, subject: str) -> SchemaRegistryError:
    from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

    if isinstance(exc, ClientError):
        what = "refused" if exc.http_status_code != 409 else "refused as incompatible"
        answer = (
            f"{what}: {exc.error_message} (HTTP {exc.http_status_code}, error code "
            f"{exc.error_code})"
        )
    else:
        answer = f"did not answer: {type(exc).__name__}: {exc}"
    return _registry_error(
        f"subject {subject!r}: the Schema Registry {url} {answer}; nothing was written"
    )


def _registry_error(message: str) -> SchemaRegistryError:
    """The error of `message`, which names the registry's URL and quotes the client's error:
    a URL's user info (the client's basic auth) and any other secret masked."""
    return SchemaRegistryError(scrubbed(message))
