"""The metric catalog spells every series name once, and follows Prometheus' naming rules."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from redline.slo import catalog

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("slo", "rules", "dashboards", "exporters", "remediation", "redline", "bench", "tests")
ALLOWED = {ROOT / "slo" / "catalog.py", Path(__file__).resolve()}
TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def _python_files() -> Iterator[Path]:
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() not in ALLOWED:
                yield path


def _docstring_ids(tree: ast.AST) -> set[int]:
    """Ids of string constants that are statements of their own (docstrings): prose, not code."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _literal_uses(path: Path, names: frozenset[str]) -> Iterator[tuple[int, str]]:
    """(line, name) of every catalog name inside a string literal of the file's code."""
    tree = ast.parse(path.read_text(), filename=str(path))
    prose = _docstring_ids(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            for token in TOKEN.findall(node.value):
                if token in names:
                    yield node.lineno, token


def test_no_series_name_is_spelled_outside_the_catalog() -> None:
    names = catalog.series_names()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {token}"
        for path in _python_files()
        for line, token in _literal_uses(path, names)
    ]
    assert not found, "use the catalog constant instead of the literal:\n" + "\n".join(found)


def test_the_scan_finds_literals_in_code_and_f_strings_but_not_in_docstrings(
    tmp_path: Path,
) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Mentions llm_requests_total in prose."""\n'
        'QUERY = f"rate(llm_requests_total[{5}m])"\n'
        'OTHER = "vectordb_write_frozen"\n'
    )
    uses = sorted(_literal_uses(sample, catalog.series_names()))
    assert uses == [(2, "llm_requests_total"), (3, "vectordb_write_frozen")]


@pytest.mark.parametrize("metric", catalog.METRICS, ids=lambda m: m.name)
def test_names_follow_prometheus_conventions(metric: catalog.Metric) -> None:
    assert NAME.match(metric.name), metric.name
    assert all(NAME.match(label) for label in metric.labels), metric.labels
    assert len(set(metric.labels)) == len(metric.labels)
    assert metric.help and metric.help == metric.help.strip() and metric.help.endswith(".")
    if metric.kind == "counter":
        assert metric.name.endswith("_total")
        assert metric.family == metric.name.removesuffix("_total")
    else:
        assert not metric.name.endswith("_total")
        assert metric.family == metric.name
    if metric.kind == "histogram":
        assert metric.bucket == f"{metric.name}_bucket"
    else:
        with pytest.raises(TypeError):
            _ = metric.bucket


def test_names_are_unique_and_looked_up() -> None:
    names = [metric.name for metric in catalog.METRICS]
    assert len(names) == len(set(names))
    assert catalog.by_name("llm_requests_total") is catalog.LLM_REQUESTS_TOTAL
    with pytest.raises(KeyError, match="not in the metric catalog"):
        catalog.by_name("no_such_series")


def test_every_series_the_generated_rules_read_is_in_the_catalog() -> None:
    rules = yaml.safe_load((ROOT / "rules/generated/redline.rules.yml").read_text())
    names = catalog.series_names()
    unknown = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            expr = re.sub(r'"[^"]*"', "", rule["expr"])  # label values are not series
            expr = re.sub(r"\{[^}]*\}", "", expr)  # nor are label names in selectors
            expr = re.sub(
                r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr
            )
            expr = re.sub(r"\[[^\]]*\]", "", expr)  # range durations
            for token in TOKEN.findall(expr):
                if "_" not in token or token.startswith(catalog.RECORD_PREFIX):
                    continue
                if token in {
                    "histogram_quantile",
                    "absent_over_time",
                    "max_over_time",
                    "label_replace",
                }:
                    continue
                if token not in names:
                    unknown.add(token)
    assert not unknown, f"series read by the rules but missing from the catalog: {sorted(unknown)}"


def test_catalog_table_lists_every_metric() -> None:
    table = catalog.render_catalog_markdown()
    assert all(f"`{metric.name}`" in table for metric in catalog.METRICS)
    assert len(table.splitlines()) == len(catalog.METRICS) + 2


def test_architecture_doc_prints_the_catalog() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    table = doc.split("<!-- catalog:start -->\n", 1)[1].split("<!-- catalog:end -->", 1)[0]
    assert table == catalog.render_catalog_markdown(), (
        "docs/architecture.md's catalog table is stale: replace it with the output of "
        "`python -m redline.slo.catalog`"
    )
