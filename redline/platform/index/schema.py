"""A collection's rows as Milvus describes them, and what the write path makes of them.

`build_row_schema` reads `describe_collection`'s answer once, at start-up: the primary key (INT64
or VARCHAR, any name, auto_id off), the one FLOAT_VECTOR field the delta log carries (any name and
dimension), the scalar fields, whether dynamic fields are on, and where redline keeps each row's
version (its `ts_ms`, `region` and `checksum`):

- `columns`: in fields `ts_ms` (INT64), `region` and `checksum` (VARCHAR) the collection has —
  the schema redline creates itself (`id, vector, ts_ms, region, checksum`);
- `dynamic`: as dynamic fields `_redline_ts_ms`, `_redline_region`, `_redline_checksum` of a
  collection with `enable_dynamic_field` (they travel in the same upsert as the row, so a row and
  its version can never disagree; user code that reads `*` sees them);
- `none`: nowhere — only for a pair replicated by something else, where redline writes nothing
  but the staleness canary.

Everything that is not the key, the vector, a version field or a function's output (BM25) is the
row's *payload*: normalised to what Milvus stores and gives back (FLOAT rounded to float32, ints
range-checked, strings length-checked, JSON round-tripped, nulls and defaults made explicit), so
a row read back from any copy has the same canonical JSON as the write it came from and can be
compared with it field by field. All pure; describing and writing are `milvus`' concern.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pymilvus import DataType

from redline.platform.index.entries import ID_PATTERN, Entry, Version
from redline.platform.index.errors import DeltaLogError, IndexSchemaError

Bookkeeping = Literal["auto", "columns", "dynamic", "none"]
PkType = Literal["int64", "varchar"]

VERSION_COLUMNS: tuple[str, str, str] = ("ts_ms", "region", "checksum")
"""Version fields of redline's own schema (`columns` bookkeeping)."""
VERSION_KEYS: tuple[str, str, str] = ("_redline_ts_ms", "_redline_region", "_redline_checksum")
"""Version fields kept as dynamic fields (`dynamic` bookkeeping)."""

_INT_RANGES: dict[DataType, tuple[int, int]] = {
    DataType.INT8: (-(2**7), 2**7 - 1),
    DataType.INT16: (-(2**15), 2**15 - 1),
    DataType.INT32: (-(2**31), 2**31 - 1),
    DataType.INT64: (-(2**63), 2**63 - 1),
}
_SCALARS = frozenset(
    {DataType.BOOL, DataType.FLOAT, DataType.DOUBLE, DataType.VARCHAR, DataType.JSON,
     DataType.ARRAY, *_INT_RANGES}
)  # fmt: skip
_ELEMENTS = frozenset({DataType.BOOL, DataType.FLOAT, DataType.DOUBLE, DataType.VARCHAR,
                       *_INT_RANGES})  # fmt: skip
_VECTORS = frozenset(
    {DataType.BINARY_VECTOR, DataType.FLOAT_VECTOR, DataType.FLOAT16_VECTOR,
     DataType.BFLOAT16_VECTOR, DataType.SPARSE_FLOAT_VECTOR, DataType.INT8_VECTOR}
)  # fmt: skip
_MISSING = object()


@dataclass(frozen=True)
class FieldSpec:
    """One scalar field of the payload: its type and the limits Milvus enforces."""

    name: str
    type: DataType
    element_type: DataType | None = None
    max_length: int | None = None
    max_capacity: int | None = None
    nullable: bool = False
    default: Any = _MISSING
    dim: int | None = None

    def normalize(self, value: Any, where: str) -> Any:
        """The value as Milvus stores it; DeltaLogError naming the field when it cannot be."""
        if value is None:
            if self.nullable:
                return None
            raise DeltaLogError(f"{where}: field {self.name!r} is not nullable")
        if self.type == DataType.FLOAT_VECTOR:
            # another dense vector of the row (the delta log carries the index's own in binary)
            array = np.asarray(value, dtype=np.float32) if not isinstance(value, str) else None
            if array is None or array.shape != (self.dim,) or not np.all(np.isfinite(array)):
                raise DeltaLogError(
                    f"{where}: field {self.name!r} expects {self.dim} finite float32 values"
                )
            return [float(x) for x in array]
        if self.type == DataType.ARRAY:
            assert self.element_type is not None  # build_row_schema checks it
            if isinstance(value, np.ndarray):
                value = value.tolist()
            if not isinstance(value, list | tuple):
                raise DeltaLogError(f"{where}: field {self.name!r} expects an array")
            if self.max_capacity is not None and len(value) > self.max_capacity:
                raise DeltaLogError(
                    f"{where}: field {self.name!r} holds at most {self.max_capacity} elements, "
                    f"got {len(value)}"
                )
            return [_scalar(self.element_type, v, self.name, where, self.max_length) for v in value]
        return _scalar(self.type, value, self.name, where, self.max_length)


def _scalar(kind: DataType, value: Any, name: str, where: str, max_length: int | None) -> Any:
    bad = f"{where}: field {name!r} ({kind.name}) cannot hold {value!r}"
    if kind == DataType.BOOL:
        if isinstance(value, bool | np.bool_):
            return bool(value)
        raise DeltaLogError(bad)
    if kind in _INT_RANGES:
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
            raise DeltaLogError(bad)
        low, high = _INT_RANGES[kind]
        if not low <= int(value) <= high:
            raise DeltaLogError(f"{bad}: out of range")
        return int(value)
    if kind in (DataType.FLOAT, DataType.DOUBLE):
        if isinstance(value, bool | np.bool_) or not isinstance(
            value, int | float | np.integer | np.floating
        ):
            raise DeltaLogError(bad)
        number = float(np.float32(value)) if kind == DataType.FLOAT else float(value)
        if not math.isfinite(number):
            raise DeltaLogError(f"{bad}: not finite")
        return number
    if kind == DataType.VARCHAR:
        if not isinstance(value, str):
            raise DeltaLogError(bad)
        if max_length is not None and len(value.encode()) > max_length:
            raise DeltaLogError(f"{where}: field {name!r} is longer than {max_length} bytes")
        return value
    if kind == DataType.JSON:
        return _json_value(value, f"{where}: field {name!r}")
    raise DeltaLogError(bad)  # build_row_schema refuses other types


def _json_value(value: Any, where: str) -> Any:
    """A JSON value as it comes back from Milvus (numpy values converted, NaN refused)."""

    def plain(obj: Any) -> Any:
        if isinstance(obj, np.generic | np.ndarray):
            return obj.tolist()
        raise TypeError(f"{type(obj).__name__} is not JSON")

    try:
        return json.loads(json.dumps(value, default=plain, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise DeltaLogError(f"{where}: not JSON ({exc})") from None


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    """Canonical JSON (sorted keys, no spaces) of a normalised payload; empty when none."""
    if not payload:
        return b""
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def decode_payload(blob: bytes) -> dict[str, Any]:
    """The payload an entry carries."""
    if not blob:
        return {}
    decoded = json.loads(blob)
    if not isinstance(decoded, dict):
        raise DeltaLogError("an entry's fields are not a JSON object")
    return decoded


@dataclass(frozen=True)
class RowSchema:
    """What the write path needs to know of a collection, from `describe_collection`."""

    collection: str
    pk: str
    pk_type: PkType
    vector: str
    dim: int
    fields: tuple[FieldSpec, ...] = ()
    dynamic: bool = False
    bookkeeping: Literal["columns", "dynamic", "none"] = "columns"
    generated: tuple[str, ...] = ()
    pk_max_length: int = 256

    # ids ---------------------------------------------------------------------------------

    def check_id(self, value: str | int) -> str:
        """The id as the delta log spells it; DeltaLogError when the key cannot hold it."""
        if self.pk_type == "int64":
            if isinstance(value, bool) or not isinstance(value, int | str | np.integer):
                raise DeltaLogError(f"invalid row id {value!r}: {self.pk} is an INT64 key")
            try:
                number = int(value)
            except ValueError:
                raise DeltaLogError(
                    f"invalid row id {value!r}: {self.pk} is an INT64 key"
                ) from None
            if not _INT_RANGES[DataType.INT64][0] <= number <= _INT_RANGES[DataType.INT64][1]:
                raise DeltaLogError(f"invalid row id {value!r}: out of the INT64 range")
            return str(number)
        if not isinstance(value, str) or not ID_PATTERN.match(value):
            raise DeltaLogError(
                f"invalid row id {value!r}: use 1-256 characters of A-Z a-z 0-9 _ . : / @ # + = -"
            )
        if len(value.encode()) > self.pk_max_length:
            raise DeltaLogError(f"invalid row id {value!r}: longer than {self.pk_max_length}")
        return value

    def key(self, row_id: str) -> str | int:
        """The id as Milvus takes it."""
        return int(row_id) if self.pk_type == "int64" else row_id

    # payload -----------------------------------------------------------------------------

    @property
    def reserved(self) -> frozenset[str]:
        """Names a payload may not use: key, vector, version fields, function outputs."""
        names = {self.pk, self.vector, *self.generated, *VERSION_KEYS}
        if self.bookkeeping == "columns":
            names.update(VERSION_COLUMNS)
        return frozenset(names)

    def normalize(self, values: Mapping[str, Any] | None, row_id: str = "") -> dict[str, Any]:
        """The payload of a write: every scalar field (given, its default, or null) and the
        dynamic fields, normalised; DeltaLogError naming the row and field otherwise."""
        where = f"{self.collection}: row {row_id!r}" if row_id else self.collection
        given = dict(values or {})
        reserved = self.reserved & set(given)
        if reserved:
            raise DeltaLogError(f"{where}: fields {sorted(reserved)} are not part of the payload")
        payload: dict[str, Any] = {}
        for spec in self.fields:
            value = given.pop(spec.name, _MISSING)
            if value is _MISSING:
                if spec.default is not _MISSING:
                    value = spec.default
                elif spec.nullable:
                    value = None
                else:
                    raise DeltaLogError(f"{where}: required field {spec.name!r} is missing")
            payload[spec.name] = spec.normalize(value, where)
        if given and not self.dynamic:
            raise DeltaLogError(
                f"{where}: fields {sorted(given)} are not in the schema and the collection has "
                "no dynamic fields"
            )
        for name, value in given.items():
            payload[name] = _json_value(value, f"{where}: dynamic field {name!r}")
        return payload

    def payload_of(self, row: Mapping[str, Any]) -> bytes:
        """The canonical payload of a row read back with `output_fields=["*"]`."""
        skip = self.reserved
        values = {k: v for k, v in row.items() if k not in skip}
        for spec in self.fields:
            values.setdefault(spec.name, None)  # Milvus leaves nulls out of some answers
        try:
            return encode_payload(self.normalize(values, str(row.get(self.pk, ""))))
        except DeltaLogError:
            # What a copy holds is reported, not refused: encode it as it came, so it differs.
            return encode_payload(_json_value(values, self.collection))

    def filler(self) -> dict[str, Any]:
        """Values for the required fields (no default, not nullable) of a synthetic row."""
        zero: dict[DataType, Any] = {DataType.BOOL: False, DataType.FLOAT: 0.0,
                                     DataType.DOUBLE: 0.0, DataType.VARCHAR: "",
                                     DataType.JSON: {}, DataType.ARRAY: []}  # fmt: skip
        # a zero vector is refused by COSINE indexes: a unit one fits every metric
        return {
            spec.name: [1.0] + [0.0] * ((spec.dim or 1) - 1)
            if spec.type == DataType.FLOAT_VECTOR
            else zero.get(spec.type, 0)
            for spec in self.fields
            if spec.default is _MISSING and not spec.nullable
        }

    # rows --------------------------------------------------------------------------------

    def _version_names(self) -> tuple[str, str, str] | None:
        if self.bookkeeping == "columns":
            return VERSION_COLUMNS
        if self.bookkeeping == "dynamic":
            return VERSION_KEYS
        return None

    def version_fields(self) -> list[str]:
        """Output fields of a read for versions and checksums only."""
        return [self.pk, *(self._version_names() or ())]

    def to_row(self, entry: Entry) -> dict[str, Any]:
        """The Milvus row of an upsert entry, with its version where this schema keeps it."""
        row = decode_payload(entry.payload) if entry.payload else {}
        row[self.pk] = self.key(entry.id)
        row[self.vector] = entry.vector
        names = self._version_names()
        if names is not None:
            row.update(zip(names, (entry.ts_ms, entry.region, entry.checksum), strict=True))
        return row

    def plain_row(self, row_id: str, vector: Any, payload: Mapping[str, Any]) -> dict[str, Any]:
        """A Milvus row without any version (what another replicator copies as it is)."""
        return {**payload, self.pk: self.key(row_id), self.vector: vector}

    def version_of(self, row: Mapping[str, Any]) -> tuple[Version, str]:
        """(version, stored checksum) of a row read back; (-1, "") and "" when it has none."""
        names = self._version_names()
        if names is None or row.get(names[0]) is None:
            return Version(-1, ""), ""
        return Version(int(row[names[0]]), str(row.get(names[1]) or "")), str(
            row.get(names[2]) or ""
        )

    # checks ------------------------------------------------------------------------------

    def differences(self, other: RowSchema) -> list[str]:
        """What keeps rows of this collection from being written to `other` as they are."""
        problems: list[str] = []
        if (self.pk, self.pk_type) != (other.pk, other.pk_type):
            problems.append(
                f"primary key {self.pk} ({self.pk_type}) vs {other.pk} ({other.pk_type})"
            )
        if (self.vector, self.dim) != (other.vector, other.dim):
            problems.append(
                f"vector field {self.vector} (dim {self.dim}) vs {other.vector} (dim {other.dim})"
            )
        theirs = {f.name: f for f in other.fields}
        for spec in self.fields:
            held = theirs.get(spec.name)
            if held is None and not other.dynamic:
                problems.append(f"field {spec.name} is missing")
            elif held is not None and (held.type, held.element_type) != (
                spec.type,
                spec.element_type,
            ):
                problems.append(f"field {spec.name} is {held.type.name}, not {spec.type.name}")
        if self.dynamic and not other.dynamic:
            problems.append("dynamic fields are off")
        return problems


def _type(raw: Any) -> DataType:
    try:
        return DataType(int(raw))
    except ValueError:
        return DataType.UNKNOWN


def _default(raw: Any) -> Any:
    """The Python value of a described field's `default_value` (a protobuf ValueField)."""
    if raw is None:
        return _MISSING
    which = raw.WhichOneof("data") if hasattr(raw, "WhichOneof") else None
    if which is None:
        return raw
    value = getattr(raw, which)
    if which == "float_data":
        return float(np.float32(value))
    return value


def build_row_schema(
    described: Mapping[str, Any],
    collection: str,
    where: str,
    dim: int | None = None,
    vector_field: str | None = None,
    bookkeeping: Bookkeeping = "auto",
) -> RowSchema:
    """The RowSchema of a described collection; IndexSchemaError naming the collection (on
    `where`, the copy's name) and the field when the write path cannot use it."""
    at = f"collection {collection} on {where}"
    raw_fields = list(described.get("fields", []))
    types = {str(f["name"]): _type(f.get("type")) for f in raw_fields}
    generated = tuple(str(f["name"]) for f in raw_fields if f.get("is_function_output"))
    pk_raw, pk_type = _primary_key(described, raw_fields, types, at)
    pk = str(pk_raw["name"])
    vector = _vector_field(types, vector_field, at)
    vector_raw = next(f for f in raw_fields if f["name"] == vector)
    vector_dim = int((vector_raw.get("params") or {}).get("dim", -1))
    if dim is not None and vector_dim != dim:
        raise IndexSchemaError(
            f"{at}: field {vector!r} has dim {vector_dim}, expected {dim} (the configured dim)"
        )
    dynamic = bool(described.get("enable_dynamic_field"))
    mode = _bookkeeping_mode(types, dynamic, bookkeeping, at)
    skip = {pk, vector, *generated, *(VERSION_COLUMNS if mode == "columns" else ())}
    specs = [
        _payload_field(raw, types[str(raw["name"])], at)
        for raw in raw_fields
        if str(raw["name"]) not in skip and not raw.get("is_dynamic")
    ]
    pk_params = pk_raw.get("params") or {}
    schema = RowSchema(
        collection=collection,
        pk=pk,
        pk_type=pk_type,
        vector=vector,
        dim=vector_dim,
        fields=tuple(specs),
        dynamic=dynamic,
        bookkeeping=mode,
        generated=generated,
        pk_max_length=int(pk_params.get("max_length", 256)),
    )
    for spec in schema.fields:
        if spec.default is not _MISSING:
            try:
                spec.normalize(spec.default, at)
            except DeltaLogError as exc:
                raise IndexSchemaError(f"{at}: default of {spec.name!r}: {exc}") from None
    return schema


def _primary_key(
    described: Mapping[str, Any],
    raw_fields: Sequence[Mapping[str, Any]],
    types: Mapping[str, DataType],
    at: str,
) -> tuple[Mapping[str, Any], PkType]:
    """The described primary key field and its key type (an INT64 or VARCHAR key the write
    path sets itself)."""
    primary = [f for f in raw_fields if f.get("is_primary")]
    if not primary:
        raise IndexSchemaError(f"{at} has no primary key field")
    pk_raw = primary[0]
    pk = str(pk_raw["name"])
    if types[pk] == DataType.INT64:
        pk_type: PkType = "int64"
    elif types[pk] == DataType.VARCHAR:
        pk_type = "varchar"
    else:
        raise IndexSchemaError(
            f"{at}: primary key field {pk!r} is {types[pk].name}; the index write path "
            "supports INT64 and VARCHAR keys"
        )
    if pk_raw.get("auto_id") or described.get("auto_id"):
        raise IndexSchemaError(
            f"{at}: primary key field {pk!r} has auto_id on; the index write path writes its "
            "own ids (create the collection with auto_id off)"
        )
    return pk_raw, pk_type


def _vector_field(types: Mapping[str, DataType], vector_field: str | None, at: str) -> str:
    """The FLOAT_VECTOR field the index is about: the configured one, else the only one."""
    floats = [n for n, t in types.items() if t == DataType.FLOAT_VECTOR]
    if vector_field is not None:
        if vector_field not in types:
            raise IndexSchemaError(
                f"{at} has no field {vector_field!r} (vector_field); fields: {sorted(types)}"
            )
        if types[vector_field] != DataType.FLOAT_VECTOR:
            raise IndexSchemaError(
                f"{at}: field {vector_field!r} is {types[vector_field].name}, not FLOAT_VECTOR"
            )
        return vector_field
    if not floats:
        raise IndexSchemaError(
            f"{at} has no FLOAT_VECTOR field (fields: "
            + ", ".join(f"{n} {t.name}" for n, t in types.items())
            + ")"
        )
    if len(floats) > 1:
        raise IndexSchemaError(
            f"{at} has FLOAT_VECTOR fields {', '.join(floats)}: set vector_field to the one the "
            "index is about (the others travel with the row)"
        )
    return floats[0]


def _bookkeeping_mode(
    types: Mapping[str, DataType], dynamic: bool, bookkeeping: Bookkeeping, at: str
) -> Literal["columns", "dynamic", "none"]:
    """Where the collection keeps row versions: the configured place, or with `auto` the
    version columns when it has them, else its dynamic fields."""
    has_columns = (
        types.get("ts_ms") == DataType.INT64
        and types.get("region") == DataType.VARCHAR
        and types.get("checksum") == DataType.VARCHAR
    )
    if bookkeeping == "auto":
        if has_columns:
            return "columns"
        if dynamic:
            return "dynamic"
        raise IndexSchemaError(
            f"{at} has nowhere to keep row versions: enable dynamic fields "
            "(enable_dynamic_field) or add fields ts_ms INT64, region VARCHAR and checksum "
            "VARCHAR (nullable fields can be added to an existing collection)"
        )
    if bookkeeping == "columns" and not has_columns:
        raise IndexSchemaError(
            f"{at}: bookkeeping 'columns' needs fields ts_ms INT64, region VARCHAR, checksum "
            "VARCHAR"
        )
    if bookkeeping == "dynamic" and not dynamic:
        raise IndexSchemaError(f"{at}: bookkeeping 'dynamic' needs enable_dynamic_field")
    return bookkeeping


def _payload_field(raw: Mapping[str, Any], kind: DataType, at: str) -> FieldSpec:
    """The spec of a described field the payload carries (IndexSchemaError: one it cannot)."""
    name = str(raw["name"])
    params = raw.get("params") or {}
    if kind == DataType.FLOAT_VECTOR:
        return FieldSpec(name, kind, nullable=bool(raw.get("nullable")),
                         dim=int(params.get("dim", -1)))  # fmt: skip
    if kind in _VECTORS:
        raise IndexSchemaError(
            f"{at}: field {name!r} is {kind.name}; the index write path carries "
            "FLOAT_VECTOR and scalar fields"
        )
    if kind not in _SCALARS:
        raise IndexSchemaError(
            f"{at}: field {name!r} is {kind.name}, which the index write path does not carry"
        )
    element = _type(raw["element_type"]) if raw.get("element_type") is not None else None
    if kind == DataType.ARRAY and element not in _ELEMENTS:
        raise IndexSchemaError(
            f"{at}: array field {name!r} has elements of type "
            f"{element.name if element else 'unknown'}, which the write path does not carry"
        )
    return FieldSpec(
        name,
        kind,
        element,
        int(params["max_length"]) if "max_length" in params else None,
        int(params["max_capacity"]) if "max_capacity" in params else None,
        bool(raw.get("nullable")),
        _default(raw.get("default_value")),
    )


def legacy_schema(collection: str, dim: int, vector: str = "vector") -> RowSchema:
    """The schema redline creates: `id` VARCHAR key, the vector, and the version columns."""
    return RowSchema(collection, "id", "varchar", vector, dim)


def describe_fields(schema: RowSchema) -> list[str]:
    """`name TYPE` of every field the payload carries (for status output and docs)."""
    return [f"{spec.name} {spec.type.name}" for spec in schema.fields] + (
        ["(dynamic fields)"] if schema.dynamic else []
    )
