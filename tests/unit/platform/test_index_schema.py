"""A collection's row schema from `describe_collection`'s answer (pure): which collections the
write path can use and how it names the field at fault otherwise, payload normalisation, rows
with their versions, and the trim point."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from pymilvus import DataType

from redline.platform.index import (
    VERSION_KEYS,
    DeltaLogError,
    Entry,
    IndexSchemaError,
    RowSchema,
    Version,
    build_row_schema,
    build_trim_point,
    decode_payload,
    encode_payload,
    legacy_schema,
    row_checksum,
    vector_checksum,
)


def _field(name: str, kind: DataType, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, "params": extra.pop("params", {}), **extra}


def _described(*fields: dict[str, Any], dynamic: bool = True, **extra: Any) -> dict[str, Any]:
    return {"fields": list(fields), "enable_dynamic_field": dynamic, **extra}


PK = _field("doc_id", DataType.INT64, is_primary=True)
VEC = _field("emb", DataType.FLOAT_VECTOR, params={"dim": 4})
RAG = _described(
    PK,
    VEC,
    _field("text", DataType.VARCHAR, params={"max_length": 10}),
    _field("score", DataType.FLOAT),
    _field("n", DataType.INT8),
    _field("tags", DataType.ARRAY, element_type=DataType.INT16, params={"max_capacity": 2}),
    _field("meta", DataType.JSON),
    _field("note", DataType.VARCHAR, params={"max_length": 5}, nullable=True),
    _field("flag", DataType.BOOL, default_value=True),
)


def _schema(described: dict[str, Any] = RAG, **kwargs: Any) -> RowSchema:
    return build_row_schema(described, "docs", "primary", **kwargs)


def test_redlines_own_schema_keeps_versions_in_columns_and_has_no_payload() -> None:
    described = _described(
        _field("id", DataType.VARCHAR, is_primary=True, params={"max_length": 256}),
        _field("vector", DataType.FLOAT_VECTOR, params={"dim": 4}),
        _field("ts_ms", DataType.INT64),
        _field("region", DataType.VARCHAR, params={"max_length": 64}),
        _field("checksum", DataType.VARCHAR, params={"max_length": 64}),
        dynamic=False,
    )
    schema = _schema(described, dim=4)
    assert schema == legacy_schema("docs", 4)
    assert schema.bookkeeping == "columns" and schema.fields == ()
    vector = np.arange(4, dtype=np.float32)
    entry = Entry("1-0", "upsert", "a", "eu", 5, vector_checksum(vector), vector)
    row = schema.to_row(entry)
    assert set(row) == {"id", "vector", "ts_ms", "region", "checksum"}
    assert schema.version_of(row) == (Version(5, "eu"), vector_checksum(vector))
    assert schema.payload_of(row) == b""  # its checksum stays the vector's


def test_a_user_collection_keeps_versions_as_dynamic_fields() -> None:
    schema = _schema(dim=4)
    assert (schema.pk, schema.pk_type, schema.vector, schema.bookkeeping) == (
        "doc_id", "int64", "emb", "dynamic",
    )  # fmt: skip
    given = {"text": "hé", "score": 0.1, "n": -3, "tags": [1, 2], "meta": {"a": [1, 0.5]},
             "extra": np.float32(2.5)}  # fmt: skip
    payload = schema.normalize(given, "7")
    assert payload == {
        "text": "hé", "score": float(np.float32(0.1)), "n": -3, "tags": [1, 2],
        "meta": {"a": [1, 0.5]}, "note": None, "flag": True, "extra": 2.5,
    }  # fmt: skip
    blob = encode_payload(payload)
    assert decode_payload(blob) == payload and blob == encode_payload(
        dict(reversed(payload.items()))
    )
    vector = np.ones(4, dtype=np.float32)
    entry = Entry("1-0", "upsert", "7", "eu", 9, row_checksum(vector, blob), vector, blob)
    row = schema.to_row(entry)
    assert row["doc_id"] == 7 and row["emb"] is vector and row["text"] == "hé"
    assert [row[k] for k in VERSION_KEYS] == [9, "eu", entry.checksum]
    # what Milvus gives back: the same row with its version fields; the payload is the write's
    assert schema.payload_of(row) == blob
    assert schema.version_of(row) == (Version(9, "eu"), entry.checksum)
    assert schema.version_of({"doc_id": 7}) == (Version(-1, ""), "")  # a row redline never wrote
    assert schema.filler() == {"text": "", "score": 0.0, "n": 0, "tags": [], "meta": {}}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"score": 1.0}, "required field 'text' is missing"),
        ({"text": "x" * 11, "score": 1, "n": 1, "tags": [], "meta": {}}, "longer than 10 bytes"),
        ({"text": "x", "score": 1, "n": 128, "tags": [], "meta": {}}, "'n' .* out of range"),
        ({"text": "x", "score": True, "n": 1, "tags": [], "meta": {}}, "'score' .* cannot hold"),
        ({"text": "x", "score": 1, "n": 1.5, "tags": [], "meta": {}}, "'n' .* cannot hold"),
        ({"text": "x", "score": 1, "n": 1, "tags": [1, 2, 3], "meta": {}}, "at most 2 elements"),
        ({"text": "x", "score": float("nan"), "n": 1, "tags": [], "meta": {}}, "not finite"),
        ({"text": "x", "score": 1, "n": 1, "tags": [], "meta": {"x": float("inf")}}, "not JSON"),
        ({"text": None, "score": 1, "n": 1, "tags": [], "meta": {}}, "'text' is not nullable"),
        ({"text": "x", "score": 1, "n": 1, "tags": [], "meta": {}, "emb": []}, "not part of"),
    ],
)
def test_payloads_the_collection_cannot_hold_name_the_row_and_field(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(DeltaLogError, match=f"docs: row '7': .*{message}"):
        _schema().normalize(values, "7")


def test_without_dynamic_fields_unknown_fields_are_refused() -> None:
    schema = _schema(_described(PK, VEC, _field("ts_ms", DataType.INT64),
                                _field("region", DataType.VARCHAR),
                                _field("checksum", DataType.VARCHAR), dynamic=False))  # fmt: skip
    with pytest.raises(DeltaLogError, match=r"fields \['lang'\] are not in the schema"):
        schema.normalize({"lang": "en"}, "1")


def test_ids_are_checked_against_the_key_type() -> None:
    int_key, str_key = _schema(), legacy_schema("docs", 4)
    assert int_key.check_id(-5) == "-5" == int_key.check_id("-5") and int_key.key("-5") == -5
    for bad in ("a", 2**63, True, 1.0):
        with pytest.raises(DeltaLogError, match="invalid row id"):
            int_key.check_id(bad)  # type: ignore[arg-type]
    assert str_key.check_id("doc:1") == "doc:1"
    with pytest.raises(DeltaLogError, match="invalid row id"):
        str_key.check_id("it's")


@pytest.mark.parametrize(
    ("described", "kwargs", "message"),
    [
        (_described(_field("pk", DataType.INT32, is_primary=True), VEC), {},
         "primary key field 'pk' is INT32; the index write path supports INT64 and VARCHAR"),
        (_described(PK, _field("v", DataType.SPARSE_FLOAT_VECTOR)), {},
         r"has no FLOAT_VECTOR field \(fields: doc_id INT64, v SPARSE_FLOAT_VECTOR\)"),
        (_described(PK, VEC, _field("e2", DataType.FLOAT_VECTOR, params={"dim": 4})), {},
         "has FLOAT_VECTOR fields emb, e2: set vector_field"),
        (RAG, {"vector_field": "body"}, "has no field 'body' \\(vector_field\\)"),
        (RAG, {"vector_field": "text"}, "field 'text' is VARCHAR, not FLOAT_VECTOR"),
        (RAG, {"dim": 8}, "field 'emb' has dim 4, expected 8"),
        (_described({**PK, "auto_id": True}, VEC), {}, "'doc_id' has auto_id on"),
        (_described(PK, VEC, _field("b", DataType.BINARY_VECTOR, params={"dim": 8})), {},
         "field 'b' is BINARY_VECTOR; the index write path carries FLOAT_VECTOR and scalar"),
        (_described(PK, VEC, _field("g", DataType.GEOMETRY)), {}, "field 'g' is GEOMETRY"),
        (_described(PK, VEC, _field("a", DataType.ARRAY, element_type=DataType.JSON)), {},
         "array field 'a' has elements of type JSON"),
        (_described(PK, VEC, dynamic=False), {}, "nowhere to keep row versions: enable dynamic"),
        (RAG, {"bookkeeping": "columns"}, "bookkeeping 'columns' needs fields ts_ms"),
        (_described(PK, VEC, dynamic=False), {"bookkeeping": "dynamic"},
         "bookkeeping 'dynamic' needs enable_dynamic_field"),
    ],
)  # fmt: skip
def test_collections_the_write_path_cannot_use_are_named_with_the_field(
    described: dict[str, Any], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(IndexSchemaError, match=f"^collection docs on primary.*{message}"):
        _schema(described, **kwargs)


def test_an_external_pair_needs_no_version_fields_and_function_outputs_are_skipped() -> None:
    sparse = _field("sparse", DataType.SPARSE_FLOAT_VECTOR, is_function_output=True)
    schema = _schema(_described(PK, VEC, sparse, dynamic=False), bookkeeping="none")
    assert schema.bookkeeping == "none" and schema.generated == ("sparse",)
    assert schema.version_fields() == ["doc_id"] and schema.fields == ()
    two = _described(PK, VEC, _field("e2", DataType.FLOAT_VECTOR, params={"dim": 2}))
    chosen = _schema(two, vector_field="e2")
    assert chosen.vector == "e2" and [f.name for f in chosen.fields] == ["emb"]
    # the other dense vector travels with the row, as float32 values
    assert chosen.normalize({"emb": np.array([0.1, 0, 0, 1])})["emb"][0] == float(np.float32(0.1))
    assert chosen.filler() == {"emb": [1.0, 0.0, 0.0, 0.0]}
    with pytest.raises(DeltaLogError, match="'emb' expects 4 finite float32 values"):
        chosen.normalize({"emb": [1.0, 2.0]})


def test_differences_say_what_keeps_rows_from_fitting_another_collection() -> None:
    schema = _schema()
    assert schema.differences(replace(schema, collection="copy")) == []
    other = replace(schema, pk_type="varchar", dim=8, dynamic=False, fields=schema.fields[1:])
    assert other.differences(schema) == [
        "primary key doc_id (varchar) vs doc_id (int64)",
        "vector field emb (dim 8) vs emb (dim 4)",
    ]
    assert schema.differences(other) == [
        "primary key doc_id (int64) vs doc_id (varchar)",
        "vector field emb (dim 4) vs emb (dim 8)",
        "field text is missing",
        "dynamic fields are off",
    ]


def test_the_trim_point_is_the_oldest_need_minus_the_retention() -> None:
    assert build_trim_point([], 0) is None  # no copy registered: nothing is known to be safe
    assert build_trim_point(["5000-3", "7000-0", "6000-1"], 0) == "5000-3"
    assert build_trim_point(["5000-3", "7000-0"], 1000) == "4000-0"
    assert build_trim_point(["5000-3"], 6000) == "0-0"
    assert build_trim_point(["0-0", "9000-0"], 0) == "0-0"  # a copy that applied nothing yet
