"""JSON payloads -> Avro: one test per merge rule, the aggregator, fastavro round trips."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from functools import reduce
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files.avro_names import AvroType
from kafka_txn_sink.files.json_schema import (
    Irreconcilable,
    SchemaAggregator,
    finalize,
    infer,
    merge,
)
from tests.unit.avro_support import PROPERTY, roundtrip, same


def aggregate(objs: list[Any], mode: Irreconcilable = "union") -> SchemaAggregator:
    aggregator = SchemaAggregator(irreconcilable=mode)
    for obj in objs:
        aggregator.add(obj)
    return aggregator


def field_types(schema: dict[str, Any]) -> dict[str, AvroType]:
    return {f["name"]: f["type"] for f in schema["fields"]}


# --- JSON inference: one test per rule of the table ------------------------------------------


def test_rule_null() -> None:
    assert infer(None) == "null"
    schema = aggregate([{"x": None}]).schema()
    assert schema["fields"] == [{"name": "x", "type": "null", "default": None}]


def test_rule_boolean_is_never_widened_to_a_number() -> None:
    assert infer(True) == "boolean"
    assert merge("boolean", "long") == ["boolean", "long"]
    aggregator = aggregate([{"x": True}, {"x": 1}])
    assert field_types(aggregator.schema())["x"] == ["boolean", "long"]
    assert roundtrip(aggregator.schema(), [aggregator.conform({"x": True})]) == [{"x": True}]


def test_rule_every_integer_is_long_and_beyond_64_bits_double() -> None:
    assert infer(1) == "long"
    assert infer(2**63 - 1) == "long"
    assert infer(-(2**63)) == "long"
    assert infer(2**63) == "double"
    aggregator = aggregate([{"x": 10**400}])
    assert roundtrip(aggregator.schema(), [aggregator.conform({"x": 10**400})]) == [{"x": math.inf}]


def test_rule_other_numbers_are_double() -> None:
    assert infer(1.5) == "double"
    objs = [{"x": math.nan}, {"x": -math.inf}, {"x": 0.1}]
    aggregator = aggregate(objs)
    back = roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs])
    assert same(back, objs)


def test_rule_strings_with_lone_surrogates_are_written_with_replacement_characters() -> None:
    assert infer("a") == "string"
    obj = json.loads('{"s": "x\\ud800y", "t": "\\ud83d\\ude00"}')
    aggregator = aggregate([obj])
    assert roundtrip(aggregator.schema(), [aggregator.conform(obj)]) == [
        {"s": "x\ufffdy", "t": "\U0001f600"}
    ]


def test_rule_objects_are_records_named_by_path_with_fields_in_first_seen_order() -> None:
    assert infer({"b": 1, "a": {"c": "x"}}, "Payload") == {
        "type": "record",
        "name": "Payload",
        "fields": [
            {"name": "b", "type": "long"},
            {
                "name": "a",
                "type": {
                    "type": "record",
                    "name": "Payload_a",
                    "fields": [{"name": "c", "type": "string"}],
                },
            },
        ],
    }
    schema = aggregate([{"z": 1}, {"a": 1, "z": 2}]).schema()
    assert [f["name"] for f in schema["fields"]] == ["z", "a"]


def test_rule_empty_object_is_a_record_without_fields() -> None:
    aggregator = aggregate([{"e": {}}, {}])
    schema = aggregator.schema()
    assert field_types(schema)["e"] == [
        "null",
        {"type": "record", "name": "Payload_e", "fields": []},
    ]
    assert roundtrip(schema, [aggregator.conform({"e": {}}), aggregator.conform({})]) == [
        {"e": {}},
        {"e": None},
    ]
    empty = SchemaAggregator().schema()
    assert empty == {"type": "record", "name": "Payload", "namespace": "kafka_txn_sink",
                     "fields": []}  # fmt: skip
    fastavro.parse_schema(empty)


def test_rule_array_elements_are_merged() -> None:
    assert infer([1, 2.5, None]) == {"type": "array", "items": ["null", "double"]}
    assert infer([1, "a"]) == {"type": "array", "items": ["long", "string"]}
    assert infer([1, "a"], irreconcilable="string") == {"type": "array", "items": "string"}


def test_rule_empty_array_takes_the_element_type_of_other_arrays() -> None:
    assert infer([]) == {"type": "array", "items": []}
    aggregator = aggregate([{"t": []}, {"t": ["a"]}, {"t": []}])
    assert field_types(aggregator.schema())["t"] == {"type": "array", "items": "string"}
    only_empty = aggregate([{"t": []}, {"t": []}])
    assert field_types(only_empty.schema())["t"] == {"type": "array", "items": "null"}
    assert roundtrip(only_empty.schema(), [only_empty.conform({"t": []})]) == [{"t": []}]


def test_rule_null_and_t_is_a_nullable_union_with_a_null_default() -> None:
    assert merge("long", "null") == ["null", "long"]
    assert merge("null", "string") == ["null", "string"]
    schema = aggregate([{"x": 1}, {"x": None}]).schema()
    assert schema["fields"] == [{"name": "x", "type": ["null", "long"], "default": None}]


def test_rule_missing_fields_become_nullable_with_a_null_default() -> None:
    objs = [{"a": 1}, {"b": "x"}]
    aggregator = aggregate(objs)
    assert aggregator.schema()["fields"] == [
        {"name": "a", "type": ["null", "long"], "default": None},
        {"name": "b", "type": ["null", "string"], "default": None},
    ]
    assert [aggregator.conform(o) for o in objs] == [{"a": 1, "b": None}, {"a": None, "b": "x"}]


def test_rule_int_widens_to_long_to_double() -> None:
    assert merge("long", "double") == "double"
    assert merge(["null", "long", "string"], "double") == ["null", "double", "string"]
    objs = [{"x": 1}, {"x": 2.5}]
    aggregator = aggregate(objs)
    assert field_types(aggregator.schema())["x"] == "double"
    conformed = [aggregator.conform(o) for o in objs]
    assert conformed == [{"x": 1.0}, {"x": 2.5}]
    assert isinstance(conformed[0]["x"], float)
    assert roundtrip(aggregator.schema(), conformed) == conformed


def test_rule_objects_merge_by_field_name_recursively() -> None:
    objs = [{"user": {"id": 1, "address": {"city": "x"}}}, {"user": {"address": {"zip": 9}}}]
    aggregator = aggregate(objs)
    user = field_types(aggregator.schema())["user"]
    assert user == {
        "type": "record",
        "name": "Payload_user",
        "fields": [
            {"name": "id", "type": ["null", "long"], "default": None},
            {
                "name": "address",
                "type": {
                    "type": "record",
                    "name": "Payload_user_address",
                    "fields": [
                        {"name": "city", "type": ["null", "string"], "default": None},
                        {"name": "zip", "type": ["null", "long"], "default": None},
                    ],
                },
            },
        ],
    }
    back = roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs])
    assert back[1] == {"user": {"id": None, "address": {"city": None, "zip": 9}}}


def test_rule_record_names_are_unique_in_the_schema() -> None:
    objs = [{"a_b": {"c": {"x": 1}}, "a": {"b_c": {"y": 1}}, "l": [{"q": 1}], "l_item": {}}]
    schema = aggregate(objs).schema()
    names = re.findall(r'"type": "record", "name": "(\w+)"', json.dumps(schema))
    assert names == [
        "Payload",
        "Payload_a_b",
        "Payload_a_b_c",
        "Payload_a",
        "Payload_a_b_c_2",
        "Payload_l_item",
        "Payload_l_item_2",
    ]
    fastavro.parse_schema(schema)


def test_rule_arrays_merge_into_one_array() -> None:
    assert merge({"type": "array", "items": "long"}, {"type": "array", "items": "string"}) == {
        "type": "array",
        "items": ["long", "string"],
    }
    objs = [{"t": [1]}, {"t": [{"k": "v"}, None]}]
    aggregator = aggregate(objs)
    assert field_types(aggregator.schema())["t"] == {
        "type": "array",
        "items": [
            "null",
            "long",
            {
                "type": "record",
                "name": "Payload_t_item",
                "fields": [{"name": "k", "type": "string"}],
            },
        ],
    }
    assert roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs]) == objs


def test_rule_invalid_field_names_are_sanitized_and_the_original_kept() -> None:
    objs = [{"a-b": 1, "1x": 2, "": 3, "é": 4}, {"a_b": 5}]
    aggregator = aggregate(objs)
    assert aggregator.schema()["fields"] == [
        {"name": "a_b_1", "type": ["null", "long"], "default": None, "originalName": "a-b"},
        {"name": "_1x", "type": ["null", "long"], "default": None, "originalName": "1x"},
        {"name": "_", "type": ["null", "long"], "default": None, "originalName": ""},
        {"name": "__1", "type": ["null", "long"], "default": None, "originalName": "é"},
        {"name": "a_b", "type": ["null", "long"], "default": None},
    ]
    back = roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs])
    assert back == [
        {"a_b_1": 1, "_1x": 2, "_": 3, "__1": 4, "a_b": None},
        {"a_b_1": None, "_1x": None, "_": None, "__1": None, "a_b": 5},
    ]


def test_rule_other_mixes_become_a_union_with_one_member_per_kind() -> None:
    objs = [{"v": "s"}, {"v": {"k": 1}}, {"v": [1]}, {"v": 2}, {"v": False}, {"v": None}]
    aggregator = aggregate(objs)
    assert field_types(aggregator.schema())["v"] == [
        "null",
        "boolean",
        "long",
        "string",
        {"type": "array", "items": "long"},
        {"type": "record", "name": "Payload_v", "fields": [{"name": "k", "type": "long"}]},
    ]
    assert roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs]) == objs


def test_rule_other_mixes_become_string_when_asked() -> None:
    objs = [{"v": "s"}, {"v": {"k": 1}}, {"v": [1, "x"]}, {"v": 2.5}, {"v": False}, {"v": None}]
    aggregator = aggregate(objs, "string")
    assert field_types(aggregator.schema())["v"] == ["null", "string"]
    back = roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs])
    assert [r["v"] for r in back] == ["s", '{"k":1}', '[1,"x"]', "2.5", "false", None]
    assert merge("string", {"type": "array", "items": "long"}, irreconcilable="string") == "string"


@pytest.mark.parametrize(
    "objs",
    [
        [{"t": [1]}, {"t": ["a"]}],
        [{"t": [[1]]}, {"t": [[], [None]]}],
        [{"x": 1}, {"x": 2**63}],
        [{"x": 1.5}, {"x": 2**70}],
        [{"x": {"a": 1}}, {"x": {"a": 1, "b": 2}}, {"x": {}}],
        [{"x": None}, {"x": {"a": True}}, {"x": {"a": 1}}],
    ],
)
def test_values_the_schema_does_not_cover_yet_are_merged(objs: list[dict[str, Any]]) -> None:
    aggregator = aggregate(objs)
    folded = reduce(lambda a, b: merge(a, b), [infer(o) for o in objs])
    assert aggregator.schema() == finalize(folded)
    conformed = [aggregator.conform(o) for o in objs]
    assert roundtrip(aggregator.schema(), conformed) == conformed


def test_conform_refuses_what_was_not_aggregated() -> None:
    aggregator = aggregate([{"x": 1}])
    with pytest.raises(InputError, match="at x"):
        aggregator.conform({"x": "a"})
    with pytest.raises(InputError, match="the root"):
        aggregator.conform({"y": 1})


def test_payloads_must_be_json_objects_of_json_values() -> None:
    with pytest.raises(InputError, match="must be a JSON object"):
        SchemaAggregator().add([1])
    with pytest.raises(InputError, match="not a JSON value"):
        SchemaAggregator().add({"x": Decimal(1)})


def test_adding_after_conform_updates_the_schema() -> None:
    aggregator = aggregate([{"x": 1}])
    assert aggregator.conform({"x": 1}) == {"x": 1}
    aggregator.add({"y": True})
    assert aggregator.conform({"x": 1}) == {"x": 1, "y": None}
    assert aggregator.count == 2


# --- property-based tests -------------------------------------------------------------------

# Few keys and small values, so that objects often share fields whose types have to merge.
KEYS = st.sampled_from(["a", "b", "a-b", "a_b", "1x", "", "é", "\ud800"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**400])
    | st.floats()
    | st.text(max_size=4)
    | st.sampled_from(["\ud800x", "é", ""])
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=8,
)
OBJECTS = st.lists(st.dictionaries(KEYS, JSON_VALUES, max_size=4), min_size=1, max_size=8)
MODES = st.sampled_from(["union", "string"])


@PROPERTY
@given(objs=OBJECTS, mode=MODES)
def test_every_aggregated_object_reads_back_under_the_final_schema(
    objs: list[dict[str, Any]], mode: Irreconcilable
) -> None:
    aggregator = aggregate(objs, mode)
    conformed = [aggregator.conform(o) for o in objs]
    back = roundtrip(aggregator.schema(), conformed)
    assert len(back) == len(objs)
    assert same(back, conformed)
    for obj, record in zip(objs, conformed, strict=True):
        assert_preserved(obj, record, aggregator.schema(), mode)


@PROPERTY
@given(objs=OBJECTS, mode=MODES)
def test_the_aggregator_equals_merging_every_inferred_type(
    objs: list[dict[str, Any]], mode: Irreconcilable
) -> None:
    folded = reduce(
        lambda a, b: merge(a, b, "Payload", mode), [infer(o, "Payload", mode) for o in objs]
    )
    assert aggregate(objs, mode).schema() == finalize(folded)


@PROPERTY
@given(value=JSON_VALUES, mode=MODES)
def test_merging_a_type_with_itself_changes_nothing(value: Any, mode: Irreconcilable) -> None:
    inferred = infer(value, "Payload", mode)
    assert merge(inferred, inferred, "Payload", mode) == inferred


def clean(value: Any) -> Any:
    """`value` with lone surrogates replaced, as Avro strings hold them."""
    if isinstance(value, str):
        return re.sub("[\ud800-\udfff]", "\ufffd", value)
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    return value


def member_for(value: Any, members: list[Any]) -> AvroType:
    def kind(t: AvroType) -> str:
        if isinstance(t, dict):
            return str(t["type"])
        return "number" if t in ("long", "double") else str(t)

    if value is None:
        wanted = "null"
    elif isinstance(value, bool):
        wanted = "boolean"
    elif isinstance(value, (int, float)):
        wanted = "number"
    elif isinstance(value, str):
        wanted = "string"
    else:
        wanted = "array" if isinstance(value, list) else "record"
    matches = [m for m in members if kind(m) == wanted]
    return matches[0] if matches else "string"  # string mode: everything else is a string


def assert_preserved(value: Any, conformed: Any, avro_type: AvroType, mode: str) -> None:
    """The conformed value holds the same information as the payload value."""
    if isinstance(avro_type, list):
        avro_type = member_for(value, avro_type)
    if avro_type == "string":
        if isinstance(value, str):
            assert conformed == clean(value)
        else:
            assert mode == "string"
            assert same(json.loads(conformed), clean(value))
    elif avro_type == "double":
        try:
            expected = float(value)
        except OverflowError:
            expected = math.inf if value > 0 else -math.inf
        assert same(conformed, expected)
    elif isinstance(avro_type, dict) and avro_type["type"] == "array":
        assert len(conformed) == len(value)
        for v, c in zip(value, conformed, strict=True):
            assert_preserved(v, c, avro_type["items"], mode)
    elif isinstance(avro_type, dict):
        fields = {f.get("originalName", f["name"]): f for f in avro_type["fields"]}
        assert set(value) <= set(fields)
        assert set(conformed) == {f["name"] for f in fields.values()}
        for key, field in fields.items():
            if key in value:
                assert_preserved(value[key], conformed[field["name"]], field["type"], mode)
            else:
                assert conformed[field["name"]] is None
    else:
        assert type(conformed) is type(value)
        assert conformed == value
