"""The driver's resolution of record formats against the test bed's real Schema Registry
(Apicurio Registry, Confluent-compatible API): registering, looking up, the latest version, and
each refusal as the error a user reads, naming the subject and the registry.

confluent_kafka.schema_registry is imported in the tests, not at collection (see
test_schema_registry_bed.py: the oldest clients' tier collects this directory).
"""

from __future__ import annotations

import base64
import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kafka_txn_sink import testing
from kafka_txn_sink.errors import ConfigError, SchemaRegistryError
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.serde.options import SerdeOptions
from kafka_txn_sink.serde.resolve import derived_schema, resolve
from kafka_txn_sink.testing.processes import free_port
from tests.s3_proxy import HeaderDroppingProxy

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

pytestmark = pytest.mark.registry

ORDER = StructType(
    [StructField("id", StringType(), nullable=False), StructField("visits", LongType())]
)
INPUT = StructType([StructField("key", StringType()), StructField("value", ORDER)])


def serde(url: str, **options: str) -> SerdeOptions:
    base = {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "sinkId": "s",
        "commitLog": "/tmp/l",
        "topic": "t",
        "schema.registry.url": url,
        "valueFormat": "avro",
    }
    return parse_options({**base, **options}).serde


def avro(schema: Any) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(schema), "AVRO")


def test_the_derived_schema_is_registered_under_the_topics_subject(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    resolved = resolve(serde(schema_registry.url), INPUT, topic)

    assert resolved is not None and resolved.key is None and resolved.value is not None
    value = resolved.value
    latest = client.get_latest_version(f"{topic}-value")
    assert (value.subject, value.schema_id) == (f"{topic}-value", latest.schema_id)
    assert json.loads(latest.schema.schema_str) == json.loads(value.schema)
    again = resolve(serde(schema_registry.url), INPUT, topic)
    assert again is not None and again.value is not None
    assert again.value.schema_id == value.schema_id  # registering twice: the same id


def test_with_auto_registration_off_a_registered_schema_is_looked_up(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    text = derived_schema("value", ORDER, "avro")
    registered = client.register_schema(f"{topic}-value", avro(json.loads(text)))

    resolved = resolve(serde(schema_registry.url, autoRegisterSchemas="false"), INPUT, topic)

    assert resolved is not None and resolved.value is not None
    assert resolved.value.schema_id == registered


def test_with_auto_registration_off_a_missing_schema_fails_naming_the_subject(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    other = {"type": "record", "name": "Value", "fields": [{"name": "x", "type": "int"}]}
    client.register_schema(f"{topic}-value", avro(other))

    with pytest.raises(SchemaRegistryError) as caught:
        resolve(serde(schema_registry.url, autoRegisterSchemas="false"), INPUT, topic)

    message = str(caught.value)
    assert message.startswith(
        f"subject '{topic}-value' of the Schema Registry {schema_registry.url} does not hold "
        f"the schema and option autoRegisterSchemas=false"
    )
    assert "compatible with the subject's latest version" in message
    assert "nothing was written" in message


def test_an_incompatible_schema_is_refused_naming_the_subject_and_the_answer(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    subject = f"{topic}-value"
    only_id = {"type": "record", "name": "Value", "namespace": "kafka_txn_sink",
               "fields": [{"name": "id", "type": "string"}]}
    client.register_schema(subject, avro(only_id))
    client.set_compatibility(subject, "BACKWARD")
    # The derived schema adds `visits` as ["null", "long"] with default null: compatible. A
    # required field without a default is not.
    required = StructType([*ORDER.fields[:1], StructField("visits", LongType(), nullable=False)])
    schema = StructType([StructField("value", required)])

    with pytest.raises(SchemaRegistryError) as caught:
        resolve(serde(schema_registry.url), schema, topic)

    message = str(caught.value)
    assert message.startswith(
        f"subject '{subject}': the Schema Registry {schema_registry.url} refused as "
        f"incompatible: "
    )
    assert "(HTTP 409, error code" in message
    resolved = resolve(serde(schema_registry.url), INPUT, topic)  # nullable: compatible
    assert resolved is not None and resolved.value is not None


def test_the_latest_version_is_used_as_registered(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    users = {"type": "record", "name": "Order", "namespace": "shop",
             "fields": [{"name": "id", "type": "string"}, {"name": "visits", "type": "long"}]}
    registered = client.register_schema(f"{topic}-value", avro(users))

    resolved = resolve(serde(schema_registry.url, useLatestVersion="true"), INPUT, topic)

    assert resolved is not None and resolved.value is not None
    assert resolved.value.schema_id == registered
    assert json.loads(resolved.value.schema)["name"] == "Order"


def test_the_record_strategy_names_the_subject_after_the_record(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    users = {"type": "record", "name": f"Order_{topic}", "namespace": "shop",
             "fields": [{"name": "id", "type": "string"}, {"name": "visits", "type": "long"}]}
    options = {"subjectNameStrategy": "record", "valueSchema": json.dumps(users)}

    resolved = resolve(serde(schema_registry.url, **options), INPUT, topic)

    assert resolved is not None and resolved.value is not None
    assert resolved.value.subject == f"shop.Order_{topic}"
    assert client.get_latest_version(f"shop.Order_{topic}").schema_id == resolved.value.schema_id


def test_a_schema_option_that_does_not_parse_is_refused_naming_it(
    schema_registry: testing.SchemaRegistry, topic: str
) -> None:
    with pytest.raises(ConfigError, match=r"^option valueSchema is not a valid avro schema: "):
        resolve(serde(schema_registry.url, valueSchema='{"type": "recrd"}'), INPUT, topic)


def test_an_unreachable_registry_fails_in_bounded_time_without_its_secret() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = serde(
        url,
        **{"schema.registry.basic.auth.user.info": "alice:pw-4242-secret",
           "schema.registry.timeout": "2", "schema.registry.max.retries": "1"},
    )
    started = time.monotonic()

    with pytest.raises(SchemaRegistryError) as caught:
        resolve(options, INPUT, "t")

    assert time.monotonic() - started < 30
    message = str(caught.value)
    assert message.startswith(f"subject 't-value': the Schema Registry {url} did not answer: ")
    assert "pw-4242-secret" not in message and caught.value.__cause__ is None


class AuthenticatingProxy(HeaderDroppingProxy):
    """The registry behind a gateway that wants HTTP basic auth (the test bed's registry has
    none): a request without the right `Authorization` gets 401, others go through."""

    def __init__(self, upstream: str, user_info: str) -> None:
        super().__init__(upstream, drop=("Authorization",))
        self.expected = "Basic " + base64.b64encode(user_info.encode()).decode()
        self.refused = 0

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if dict((k.lower(), v) for k, v in headers).get("authorization") != self.expected:
            self.refused += 1
            answer = b'{"error_code": 40101, "message": "Unauthorized"}'
            return 401, "Unauthorized", [("Content-Type", "application/json")], answer
        return super().forward(method, path, headers, body)


def test_basic_auth_reaches_the_registry_and_its_refusal_names_no_secret(
    schema_registry: testing.SchemaRegistry, topic: str
) -> None:
    path = schema_registry.url.split("/", 3)[3]  # apis/ccompat/v7
    with AuthenticatingProxy(schema_registry.base_url, "alice:pw-7331-secret") as proxy:
        url = f"{proxy.endpoint}/{path}"
        resolved = resolve(
            serde(url, **{"schema.registry.basic.auth.user.info": "alice:pw-7331-secret"}),
            INPUT,
            topic,
        )
        assert resolved is not None and resolved.value is not None
        with pytest.raises(SchemaRegistryError) as caught:
            resolve(
                serde(url, **{"schema.registry.basic.auth.user.info": "alice:wrong-pw-secret"}),
                INPUT,
                topic,
            )

    message = str(caught.value)
    assert f"subject '{topic}-value': the Schema Registry {url} refused: " in message
    assert "(HTTP 401, error code 40101)" in message
    assert "secret" not in message and proxy.refused == 1


def test_basic_auth_as_username_and_password_reaches_the_registry(
    schema_registry: testing.SchemaRegistry, topic: str
) -> None:
    """The pair Spark's plans redact (the key names a password) works as user.info does."""
    path = schema_registry.url.split("/", 3)[3]
    pair = {"schema.registry.basic.auth.username": "alice"}
    with AuthenticatingProxy(schema_registry.base_url, "alice:pw-7331-secret") as proxy:
        url = f"{proxy.endpoint}/{path}"
        good = serde(url, **pair, **{"schema.registry.basic.auth.password": "pw-7331-secret"})
        resolved = resolve(good, INPUT, topic)
        assert resolved is not None and resolved.value is not None
        wrong = serde(url, **pair, **{"schema.registry.basic.auth.password": "wrong-pw-secret"})
        with pytest.raises(SchemaRegistryError, match="HTTP 401") as caught:
            resolve(wrong, INPUT, topic)

    assert "secret" not in str(caught.value) and proxy.refused == 1
    assert "secret" not in repr(good)


def test_user_info_in_the_registry_url_authenticates_and_no_refusal_shows_it(
    schema_registry: testing.SchemaRegistry, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """confluent-kafka's client takes basic auth from the URL's user info: it works, and the
    password shows neither in the refusals (HTTP 401, and 404 of a missing schema) nor in the
    logs nor in the options' repr."""
    path = schema_registry.url.split("/", 3)[3]
    proxy = AuthenticatingProxy(schema_registry.base_url, "alice:pw-url-9157")
    with proxy:
        host = proxy.endpoint.split("://", 1)[1]
        good = serde(f"http://alice:pw-url-9157@{host}/{path}")
        unregistered = serde(good.registry["url"], autoRegisterSchemas="false", valueSchema=OTHER)
        with caplog.at_level("DEBUG"):
            resolved = resolve(good, INPUT, topic)
            assert resolved is not None and resolved.value is not None
            with pytest.raises(SchemaRegistryError, match="HTTP 404") as missing:
                resolve(unregistered, INPUT, topic)
            with pytest.raises(SchemaRegistryError, match="HTTP 401") as refused:
                resolve(serde(f"http://alice:wrong-url-9157@{host}/{path}"), INPUT, topic)

    assert proxy.refused == 1
    assert f"the Schema Registry http://***@{host}/{path} " in str(refused.value)
    assert f"of the Schema Registry http://***@{host}/{path} does not" in str(missing.value)
    shown = [str(missing.value), str(refused.value), caplog.text, repr(good)]
    assert not [text for text in shown if "url-9157" in text]


OTHER = json.dumps({"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]})
