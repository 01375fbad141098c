"""Records mode's key and value formats and the Schema Registry they use: the options.

`raw` (the default) takes `key` and `value` as Spark's Kafka sink does, string or binary. `avro`
and `json-schema` take a column of any type (a struct, most often), `protobuf` a struct and the
user's `.proto`, and write it in Confluent's wire format, against a Schema Registry whose client
settings are the options prefixed `schema.registry.` (`schema.registry.url`, its auth and TLS).
The driver resolves each schema id before any transaction opens (serde/resolve.py); tasks only
encode (serde/encode.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.option import Option, truthy
from kafka_txn_sink.redaction import mask_in_logs, redact, without_user_info

Format = Literal["raw", "avro", "json-schema", "protobuf"]
Strategy = Literal["topic", "record", "topic_record"]
FORMATS: tuple[Format, ...] = ("raw", "avro", "json-schema", "protobuf")
STRATEGIES: tuple[Strategy, ...] = ("topic", "record", "topic_record")
REGISTRY_PREFIX = "schema.registry."
log = logging.getLogger(__name__)

_Choice = TypeVar("_Choice", bound=str)

KEY_FORMAT = Option(
    "keyFormat",
    "how column `key` is written: `raw` (string or binary, as Spark's Kafka sink), `avro`, "
    "`json-schema` (a column of any type) or `protobuf` (a struct, with `keySchema`), in "
    "Confluent's wire format: magic byte 0, the schema id, the payload",
    "raw",
    group="registry",
)
VALUE_FORMAT = Option(
    "valueFormat", "how column `value` is written, as `keyFormat`", "raw", group="registry"
)
KEY_SCHEMA = Option(
    "keySchema",
    "the key's schema (Avro schema JSON, a JSON Schema, or `.proto` text whose first message "
    "is written); by default derived from the column's Spark type (for Avro as files mode "
    "maps types, the record named `Key`); required with `protobuf`",
    group="registry",
)
VALUE_SCHEMA = Option(
    "valueSchema", "the value's schema, as `keySchema` (record `Value`)", group="registry"
)
KEY_SUBJECT = Option(
    "keySubject", "the key's subject; by default from `subjectNameStrategy`", group="registry"
)
VALUE_SUBJECT = Option("valueSubject", "the value's subject, as `keySubject`", group="registry")
SUBJECT_NAME_STRATEGY = Option(
    "subjectNameStrategy",
    "`topic`: `<topic>-key` / `<topic>-value`; `record`: the record's full name; "
    "`topic_record`: `<topic>-<full name>` (the record strategies need a named schema: an "
    "Avro record, a titled JSON Schema, or a protobuf message: `package.Message`)",
    "topic",
    group="registry",
)
AUTO_REGISTER = Option(
    "autoRegisterSchemas",
    "register the schema under its subject when it is not there (the registry checks its "
    "compatibility); `false`: it must be registered already, or the query fails at its start",
    "true",
    group="registry",
)
USE_LATEST_VERSION = Option(
    "useLatestVersion",
    "write with the subject's latest registered schema (which the column's values must fit) "
    "instead of the column's own; nothing is registered",
    "false",
    group="registry",
)
REGISTRY_SETTINGS = Option(
    "schema.registry.*",
    "the Schema Registry client's settings, prefix removed: `schema.registry.url` (required "
    "with `avro`, `json-schema` or `protobuf`); basic auth as `schema.registry.basic.auth."
    "username` and `.password` (Spark's plans hide a password there, not in "
    "`basic.auth.user.info`); a static token as `bearer.auth.credentials.source=STATIC_TOKEN`, "
    "`bearer.auth.token` and `bearer.auth.logical.cluster`; TLS as `ssl.ca.location`, "
    "`ssl.certificate.location`, `ssl.key.location` (secrets are never logged)",
    group="registry",
)

SERDE_OPTIONS: tuple[Option, ...] = (
    KEY_FORMAT,
    VALUE_FORMAT,
    KEY_SCHEMA,
    VALUE_SCHEMA,
    KEY_SUBJECT,
    VALUE_SUBJECT,
    SUBJECT_NAME_STRATEGY,
    AUTO_REGISTER,
    USE_LATEST_VERSION,
    REGISTRY_SETTINGS,
)


@dataclass(frozen=True)
class FieldFormat:
    """How one of `key` and `value` is written."""

    column: Literal["key", "value"]
    format: Format = "raw"
    schema: str | None = None  # the user's schema text; None: derived or the latest
    subject: str | None = None  # the user's subject; None: by the strategy

    @property
    def raw(self) -> bool:
        """Bytes as given: no schema, no registry."""
        return self.format == "raw"


@dataclass(frozen=True)
class SerdeOptions:
    """Both columns' formats and the registry settings (which hold secrets: never shown)."""

    key: FieldFormat = FieldFormat("key")
    value: FieldFormat = FieldFormat("value")
    strategy: Strategy = "topic"
    auto_register: bool = True
    use_latest: bool = False
    registry: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def uses_registry(self) -> bool:
        """Whether either column is written against the registry."""
        return not (self.key.raw and self.value.raw)

    def fields(self) -> tuple[FieldFormat, ...]:
        """The columns written against the registry, key first."""
        return tuple(f for f in (self.key, self.value) if not f.raw)

    def __repr__(self) -> str:
        return (
            f"SerdeOptions(key={self.key}, value={self.value}, strategy={self.strategy!r}, "
            f"auto_register={self.auto_register}, use_latest={self.use_latest}, "
            f"registry={redact(self.registry)})"
        )


def registry_settings(raw: Mapping[str, str]) -> dict[str, str]:
    """The options prefixed `schema.registry.`, prefix removed, names as given; their secrets
    are masked in this process's logs from now on. `basic.auth.username` and
    `basic.auth.password` become the client's `basic.auth.user.info`.

    Raises:
        ConfigError: only one of the username and the password is given.
    """
    settings = {
        str(k)[len(REGISTRY_PREFIX) :]: str(v)
        for k, v in raw.items()
        if str(k).lower().startswith(REGISTRY_PREFIX)
    }
    mask_in_logs(settings)  # the URL's user info too, which the client takes as basic auth
    url = settings.get("url", "")
    if without_user_info(url) != url:
        _warn_url_user_info()
    return _user_info_from_pair(settings)


_PAIR = ("basic.auth.username", "basic.auth.password")
_user_info_warned = False
_url_user_info_warned = False


def _user_info_from_pair(settings: dict[str, str]) -> dict[str, str]:
    """Spark prints a query's options in its plans and errors, redacting only names or values
    that match `spark.redaction.regex` (by default secret|password|token|access.?key): a
    password under `basic.auth.password` is hidden there, one inside `basic.auth.user.info`
    is not. So the pair is offered, and turned into the client's own setting here."""
    lowered = {k.lower(): k for k in settings}
    given = [name for name in _PAIR if name in lowered]
    if not given:
        if "basic.auth.user.info" in lowered:
            _warn_user_info()
        return settings
    if len(given) == 1 or "basic.auth.user.info" in lowered:
        raise ConfigError(
            f"options {REGISTRY_PREFIX}{_PAIR[0]} and {REGISTRY_PREFIX}{_PAIR[1]} go together, "
            f"instead of {REGISTRY_PREFIX}basic.auth.user.info"
        )
    pair = [settings.pop(lowered[name]) for name in _PAIR]
    if ":" in pair[0]:  # the client splits user:password at the first colon
        raise ConfigError(f"option {REGISTRY_PREFIX}{_PAIR[0]} cannot hold ':'")
    settings["basic.auth.user.info"] = f"{pair[0]}:{pair[1]}"
    mask_in_logs(settings)
    return settings


def _warn_user_info() -> None:
    global _user_info_warned
    if not _user_info_warned:
        _user_info_warned = True
        log.warning(
            "option %sbasic.auth.user.info is shown in clear in Spark's query plans and errors "
            "(spark.redaction.regex does not match it); give %s%s and %s%s instead",
            REGISTRY_PREFIX,
            REGISTRY_PREFIX,
            _PAIR[0],
            REGISTRY_PREFIX,
            _PAIR[1],
        )


def _warn_url_user_info() -> None:
    global _url_user_info_warned
    if not _url_user_info_warned:
        _url_user_info_warned = True
        log.warning(
            "option %surl holds a user info (user:password@), which Spark's query plans and "
            "errors show in clear (spark.redaction.regex does not match it); give %s%s and "
            "%s%s instead",
            REGISTRY_PREFIX,
            REGISTRY_PREFIX,
            _PAIR[0],
            REGISTRY_PREFIX,
            _PAIR[1],
        )


def parse_serde_options(options: Mapping[str, str], raw: Mapping[str, str]) -> SerdeOptions:
    """The formats of `options` (keys lower-cased); `raw` has the names as the user wrote them.

    Raises:
        ConfigError: a format or strategy is unknown, a registry format has no
            `schema.registry.url`, or an option of the registry is set with both columns raw.
    """
    parsed = SerdeOptions(
        key=_field(options, "key", KEY_FORMAT, KEY_SCHEMA, KEY_SUBJECT),
        value=_field(options, "value", VALUE_FORMAT, VALUE_SCHEMA, VALUE_SUBJECT),
        strategy=_choice(options, SUBJECT_NAME_STRATEGY, STRATEGIES),
        auto_register=truthy(options.get(AUTO_REGISTER.key, AUTO_REGISTER.default)),
        use_latest=truthy(options.get(USE_LATEST_VERSION.key, USE_LATEST_VERSION.default)),
        registry=registry_settings(raw),
    )
    if not parsed.uses_registry:  # (a schema or subject of a raw column: refused by _field)
        shared = (SUBJECT_NAME_STRATEGY, AUTO_REGISTER, USE_LATEST_VERSION)
        unused = [o.name for o in shared if o.key in options]
        unused += [f"{REGISTRY_PREFIX}{k}" for k in parsed.registry]
        if unused:
            raise ConfigError(
                f"option(s) {', '.join(unused)} need option {KEY_FORMAT} or {VALUE_FORMAT} set "
                f"to avro, json-schema or protobuf"
            )
    elif not parsed.registry.get("url", "").strip():
        raise ConfigError(
            f"option {REGISTRY_PREFIX}url is required with {_formats_in_use(parsed)}: the "
            f"Schema Registry's address (http[s]://host:port[/path])"
        )
    _check_protobuf_schemas(parsed)
    return parsed


def _check_protobuf_schemas(parsed: SerdeOptions) -> None:
    """A protobuf column has its `.proto` (no schema is derived from a Spark type), unless it
    is written with the subject's latest one."""
    for f in parsed.fields():
        if f.format == "protobuf" and f.schema is None and not parsed.use_latest:
            schema_option = KEY_SCHEMA if f.column == "key" else VALUE_SCHEMA
            format_option = KEY_FORMAT if f.column == "key" else VALUE_FORMAT
            raise ConfigError(
                f"option {schema_option} is required with {format_option}=protobuf: the "
                f"message's .proto text (no protobuf schema is derived from the column's Spark "
                f"type), or set {USE_LATEST_VERSION}=true to write with the subject's latest"
            )


def _field(
    options: Mapping[str, str],
    column: Literal["key", "value"],
    format_option: Option,
    schema_option: Option,
    subject_option: Option,
) -> FieldFormat:
    chosen = _choice(options, format_option, FORMATS)
    given_schema = options.get(schema_option.key, "")
    schema = given_schema.strip() or None
    if schema and chosen == "protobuf":
        # Apicurio looks a .proto up by its bytes, so it must stay as registered from its file.
        schema = given_schema
    subject = options.get(subject_option.key, "").strip() or None
    if chosen == "raw" and (schema or subject):
        given = schema_option if schema else subject_option
        raise ConfigError(
            f"option {given} needs option {format_option} set to avro, json-schema or protobuf "
            f"(the column {column} is written raw)"
        )
    return FieldFormat(column, chosen, schema, subject)


def _choice(options: Mapping[str, str], option: Option, choices: tuple[_Choice, ...]) -> _Choice:
    value = options.get(option.key, "").strip().lower() or option.default
    for known in choices:
        if value == known:
            return known
    raise ConfigError(
        f"option {option} must be one of {', '.join(choices)}, got {options[option.key]!r}"
    )


def _formats_in_use(parsed: SerdeOptions) -> str:
    return " and ".join(
        f"{KEY_FORMAT if f.column == 'key' else VALUE_FORMAT}={f.format}" for f in parsed.fields()
    )
