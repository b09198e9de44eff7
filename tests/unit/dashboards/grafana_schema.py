"""Dashboards read through Grafana's own schema: grafana-foundation-sdk's models, made strict.

The SDK's models are generated from Grafana's schema (the dashboard kind and every core panel
and datasource plugin), but `from_json` is lenient: it drops the keys it does not know, keeps a
value of the wrong type as it is, reads an unknown panel type's options as a plain dict and a
target of an unknown datasource as an opaque bag. This module adds the strictness:

1. every value is checked against the model's type hints (scalars, enums, literals, lists,
   nested models, panel options and field config through the panel plugin's own model, targets
   through the datasource's query model), with raw dicts the SDK leaves unparsed (panel links,
   transformations) read into their model first;
2. the dashboard is serialised back from the models and compared with ours key by key: a key
   that does not survive is a field Grafana's schema does not know (or a null where the schema
   has none);
3. what the schema states but the SDK cannot type: a panel type must be a panel plugin Grafana
   ships, a target must belong to a datasource whose query model is known, a grid position
   must fit the 24-column grid, and (redline's rule) every datasource reference names both the
   plugin type and the uid, since a ref without a uid silently falls back to the default
   datasource.

Each problem names the dashboard, the panel (when there is one) and the JSON path.
"""

from __future__ import annotations

import copy
import enum
import json
import re
import types
import typing
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as schema

register_default_plugins()

SDK_DISTRIBUTION = "grafana-foundation-sdk"
GRAFANA_VERSION = "11.1.0"
"""The Grafana release whose schema the installed SDK build describes (the part after `!`)."""

OWN_KEYS = frozenset({"__generated__"})
"""Top-level keys of ours that Grafana keeps without reading, like its own export keys
(`__inputs`, `__requires`): the DO-NOT-EDIT marker."""

PROMETHEUS_ANNOTATION_KEYS = frozenset(
    {"step", "tagKeys", "textFormat", "titleFormat", "useValueForTime"}
)
"""Grafana's annotation query is open: a datasource spreads its own query into it. These are
the keys Grafana's Prometheus datasource reads there (the SDK models `expr` itself)."""

ROW = "row"
GRAFANA_DATASOURCE = "grafana"
"""The plugin type of Grafana's built-in `-- Grafana --` datasource (the stock annotation)."""
REQUIRED_TARGET_KEYS: dict[str, tuple[str, ...]] = {"prometheus": ("refId", "expr")}
"""Keys a target's query model requires with no default (the SDK fills them with "")."""

_ERRORS = (TypeError, KeyError, AttributeError, ValueError)
"""What a lenient `from_json` raises on input it cannot read at all (a null object, a list)."""


@dataclass(frozen=True)
class Problem:
    """One thing Grafana's schema does not accept, and where."""

    dashboard: str
    panel: str | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"panel {self.panel!r} " if self.panel is not None else ""
        return f"{self.dashboard}: {where}at {self.path}: {self.message}"


def sdk_grafana_version() -> str:
    """The Grafana release the installed SDK's models describe (`<build>!<grafana>`)."""
    version = metadata.version(SDK_DISTRIBUTION)
    return version.split("!", 1)[1] if "!" in version else version


def known_datasource_types() -> frozenset[str]:
    """Datasource plugins Grafana ships with a query model in the SDK, and Grafana's own."""
    return frozenset(cogruntime.Runtime().dataquery_variants) | {GRAFANA_DATASOURCE}


def known_panel_types() -> frozenset[str]:
    """Panel plugins Grafana ships (the SDK registers one model per core panel), and rows."""
    return frozenset(cogruntime.Runtime().panelcfg_variants) | {ROW}


def schema_problems(data: dict[str, Any]) -> list[Problem]:
    """Everything in the dashboard JSON `data` that Grafana's schema does not accept."""
    original = copy.deepcopy(data)
    found: list[tuple[str, str]] = []
    try:
        model = schema.Dashboard.from_json(copy.deepcopy(data))
    except _ERRORS as error:
        found.append(_unreadable(original, error))
    else:
        _check_model(model, "$", found)
        again = json.loads(json.dumps(model, cls=JSONEncoder))
        _compare(original, again, "$", found)
        _check_semantics(original, found)
    title = str(original.get("title", "?"))
    return [Problem(title, _panel_title(original, path), path, message) for path, message in found]


# --- 1. types -----------------------------------------------------------------------------


def _is_model(value: object) -> bool:
    return callable(getattr(value, "to_json", None)) and hasattr(type(value), "from_json")


def _is_model_class(hint: object) -> bool:
    return isinstance(hint, type) and hasattr(hint, "from_json") and hasattr(hint, "to_json")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _json_key(attribute: str, value: object, payload: dict[str, object]) -> str | None:
    """The JSON key `to_json` writes `attribute` under (the SDK appends `_val` to names that
    clash with Python's, and keeps a few snake_case keys such as `refresh_intervals`)."""
    bare = attribute.removesuffix("_val")
    for key in (_camel(bare), bare, attribute):
        if key in payload and payload[key] is value:
            return key
    return None


def _check_model(model: Any, path: str, found: list[tuple[str, str]]) -> None:
    """Check every attribute of `model` against its type hint, reading raw dicts into models."""
    hints = typing.get_type_hints(type(model))
    payload = model.to_json()
    for attribute, hint in hints.items():
        value = getattr(model, attribute)
        key = _json_key(attribute, value, payload)
        if key is None:
            continue  # not written: an optional left out
        setattr(model, attribute, _check(value, hint, f"{path}.{key}", found))


def _describe(hint: object) -> str:
    if isinstance(hint, type):
        if issubclass(hint, enum.Enum):
            return " | ".join(repr(member.value) for member in hint)
        return hint.__name__
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join(_describe(arg) for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is list:
        return f"a list of {_describe(typing.get_args(hint)[0])}"
    return str(hint).replace("typing.", "")


def _scalar_ok(value: object, hint: type) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, hint)


def _wrong(value: object, hint: object, path: str, found: list[tuple[str, str]]) -> object:
    shown = json.dumps(value, cls=JSONEncoder)
    found.append((path, f"wrong type: {shown[:60]} where the schema wants {_describe(hint)}"))
    return value


def _check(value: Any, hint: Any, path: str, found: list[tuple[str, str]]) -> Any:
    """`value` checked against `hint`; returns it with raw dicts read into their models."""
    origin = typing.get_origin(hint)
    if hint is typing.Any or hint is object:
        if _is_model(value):  # panel options and custom field config: the plugin's model
            _check_model(value, path, found)
        return value
    if origin in (typing.Union, types.UnionType):
        return _check_union(value, typing.get_args(hint), path, found)
    if origin is typing.Literal:
        if any(value == arg and type(value) is type(arg) for arg in typing.get_args(hint)):
            return value
        return _wrong(value, hint, path, found)
    if origin is list:
        if not isinstance(value, list):
            return _wrong(value, hint, path, found)
        (item,) = typing.get_args(hint)
        return [_check(v, item, f"{path}[{i}]", found) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            return _wrong(value, hint, path, found)
        _, item = typing.get_args(hint)
        return {k: _check(v, item, f"{path}.{k}", found) for k, v in value.items()}
    if hint is cogvariants.Dataquery:
        return _check_dataquery(value, path, found)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        base = int if issubclass(hint, int) else str
        members = {member.value for member in hint}
        if _scalar_ok(value, base) and value in members:
            return value
        return _wrong(value, hint, path, found)
    if _is_model_class(hint):
        return _check_nested(value, hint, path, found)
    if isinstance(hint, type):
        return value if _scalar_ok(value, hint) else _wrong(value, hint, path, found)
    raise NotImplementedError(f"{path}: no check for the type hint {hint!r}")


def _check_nested(value: Any, hint: type, path: str, found: list[tuple[str, str]]) -> Any:
    if isinstance(value, hint):
        _check_model(value, path, found)
        return value
    if not isinstance(value, dict):
        return _wrong(value, hint, path, found)
    try:
        model = typing.cast(Any, hint).from_json(value)
    except _ERRORS as error:
        found.append((path, f"the schema's {hint.__name__} cannot read it ({error!r})"))
        return value
    _check_model(model, path, found)
    return model


def _check_union(
    value: Any, options: tuple[Any, ...], path: str, found: list[tuple[str, str]]
) -> Any:
    """The first option `value` fully satisfies; failing all, the problems of the first option
    of its shape (a list, a dict, a model already read), so they keep their exact path."""
    if value is None and type(None) in options:
        return value
    candidates = [option for option in options if option is not type(None)]
    for option in candidates:
        if (
            option is object
            or option is typing.Any
            or (_is_model_class(option) and isinstance(value, option))
        ):
            return _check(value, option, path, found)
    for option in candidates:
        attempt: list[tuple[str, str]] = []
        checked = _check(copy.deepcopy(value), option, path, attempt)
        if not attempt:
            return checked
    shaped = [option for option in candidates if _same_shape(value, option)]
    if shaped:
        return _check(value, shaped[0], path, found)
    return _wrong(value, typing.Union[options], path, found)  # noqa: UP007 (built at runtime)


def _same_shape(value: object, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is list:
        return isinstance(value, list)
    if origin is dict or _is_model_class(hint):
        return isinstance(value, dict) or _is_model(value)
    return False


def _check_dataquery(value: Any, path: str, found: list[tuple[str, str]]) -> Any:
    if isinstance(value, cogruntime.UnknownDataquery):
        found.append(
            (
                path,
                "a target of no datasource the schema knows (set the panel's or the target's "
                f"datasource type; known: {sorted(cogruntime.Runtime().dataquery_variants)})",
            )
        )
        return value
    if not isinstance(value, cogvariants.Dataquery):
        return _wrong(value, cogvariants.Dataquery, path, found)
    _check_model(value, path, found)
    return value


# --- 2. round trip ------------------------------------------------------------------------


def _compare(ours: Any, again: Any, path: str, found: list[tuple[str, str]]) -> None:
    """Report what our JSON holds that the schema's models did not keep."""
    if isinstance(ours, dict) and isinstance(again, dict):
        for key, value in ours.items():
            where = f"{path}.{key}"
            if key in again:
                _compare(value, again[key], where, found)
            elif not _open(path, key, ours):
                found.append((where, _dropped(value)))
        return
    if isinstance(ours, list) and isinstance(again, list):
        if len(ours) != len(again):
            found.append((path, f"{len(ours)} items, the schema's model keeps {len(again)}"))
        for index, (mine, theirs) in enumerate(zip(ours, again, strict=False)):
            _compare(mine, theirs, f"{path}[{index}]", found)
        return
    if ours != again or type(ours) is not type(again):
        shown = json.dumps(again)[:60]
        found.append((path, f"the schema reads {json.dumps(ours)[:60]} as {shown}"))


def _dropped(value: object) -> str:
    if value is None:
        return "null where Grafana's schema has no null (leave the field out)"
    return "a field Grafana's schema does not know"


_ANNOTATION = re.compile(r"^\$\.annotations\.list\[\d+\]$")


def _open(path: str, key: str, parent: dict[str, Any]) -> bool:
    """True where Grafana's schema is open for `key`: our marker at the top level, and the
    Prometheus datasource's own keys in an annotation query."""
    if path == "$":
        return key in OWN_KEYS
    if _ANNOTATION.match(path):
        datasource = parent.get("datasource")
        prometheus = isinstance(datasource, dict) and datasource.get("type") == "prometheus"
        return prometheus and key in PROMETHEUS_ANNOTATION_KEYS
    return False


# --- 3. what the schema states but the models cannot type -----------------------------------


def _check_semantics(data: dict[str, Any], found: list[tuple[str, str]]) -> None:
    panels = data.get("panels") or []
    for index, panel in enumerate(panels):
        _check_panel(panel, f"$.panels[{index}]", found)
        for nested, child in enumerate(panel.get("panels") or []):
            _check_panel(child, f"$.panels[{index}].panels[{nested}]", found)
    datasources = known_datasource_types()
    for path, ref in _datasource_refs(data, "$"):
        missing = [key for key in ("type", "uid") if not ref.get(key)]
        if missing:
            found.append(
                (
                    path,
                    f"the datasource reference has no {' and no '.join(missing)} (Grafana "
                    "would use the default datasource instead of `$datasource`)",
                )
            )
        elif ref["type"] not in datasources:
            found.append((f"{path}.type", f"{ref['type']!r} is not a datasource Grafana ships"))


def _check_panel(panel: dict[str, Any], path: str, found: list[tuple[str, str]]) -> None:
    """A panel's plugin, grid position and targets: their datasource is the panel's (Grafana
    reads every target with the panel datasource's query model) with its required keys."""
    kind = panel.get("type")
    if kind not in known_panel_types():
        found.append((f"{path}.type", f"{kind!r} is not a panel plugin Grafana ships"))
    _check_grid(panel.get("gridPos"), f"{path}.gridPos", found)
    source = (panel.get("datasource") or {}).get("type")
    for index, target in enumerate(panel.get("targets") or []):
        where = f"{path}.targets[{index}]"
        own = (target.get("datasource") or {}).get("type", source)
        if own != source:
            found.append(
                (f"{where}.datasource.type", f"{own!r} in a panel of datasource {source!r}")
            )
        for key in REQUIRED_TARGET_KEYS.get(str(source), ()):
            if not target.get(key):
                found.append((f"{where}.{key}", "required by the query model, missing or empty"))


def _check_grid(pos: object, path: str, found: list[tuple[str, str]]) -> None:
    """The bounds of Grafana's `#GridPos`: h > 0, 0 < w <= 24, 0 <= x < 24, y >= 0, and the
    panel inside the 24 columns."""
    if not isinstance(pos, dict):
        return
    numbers = {k: pos.get(k) for k in ("h", "w", "x", "y")}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in numbers.values()):
        return  # reported as a wrong type
    h, w, x, y = (typing.cast(int, numbers[k]) for k in ("h", "w", "x", "y"))
    if h <= 0 or not 0 < w <= 24 or not 0 <= x < 24 or y < 0 or x + w > 24:
        found.append((path, f"outside Grafana's 24-column grid: {json.dumps(pos)}"))


def _datasource_refs(value: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every `datasource` object in the dashboard, with its path."""
    refs: list[tuple[str, dict[str, Any]]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}"
            if key == "datasource" and isinstance(item, dict):
                refs.append((where, item))
            else:
                refs.extend(_datasource_refs(item, where))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            refs.extend(_datasource_refs(item, f"{path}[{index}]"))
    return refs


# --- where --------------------------------------------------------------------------------


_PANEL = re.compile(r"^\$\.panels\[(\d+)\](?:\.panels\[(\d+)\])?")


def _panel_title(data: dict[str, Any], path: str) -> str | None:
    match = _PANEL.match(path)
    if match is None:
        return None
    try:
        panel = data["panels"][int(match.group(1))]
        if match.group(2) is not None:
            panel = panel["panels"][int(match.group(2))]
        return str(panel.get("title", "?"))
    except (KeyError, IndexError, TypeError):
        return "?"


def _unreadable(data: dict[str, Any], error: Exception) -> tuple[str, str]:
    """Where the SDK's `from_json` gave up: the first panel, variable or annotation it cannot
    read on its own, else the dashboard."""
    sections: list[tuple[str, list[Any], Any]] = [
        ("$.panels", data.get("panels") or [], None),
        (
            "$.templating.list",
            (data.get("templating") or {}).get("list") or [],
            schema.VariableModel,
        ),
        (
            "$.annotations.list",
            (data.get("annotations") or {}).get("list") or [],
            schema.AnnotationQuery,
        ),
    ]
    for base, items, model in sections:
        for index, item in enumerate(items):
            kind = model or (schema.RowPanel if item.get("type") == ROW else schema.Panel)
            try:
                kind.from_json(copy.deepcopy(item))
            except _ERRORS as inner:
                return f"{base}[{index}]", f"the schema's models cannot read it ({inner!r})"
    return "$", f"the schema's models cannot read it ({error!r})"
