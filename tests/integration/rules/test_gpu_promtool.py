"""The GPU family's promtool cases against the real promtool: they pass for the default spec and
for one with the node labels renamed, ignored XIDs and an NVLink threshold, and they fail when a
rule is broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import Gpu, Spec
from tests.support.promtool import run_family_cases, run_with_broken_rule, write_family_cases

pytestmark = pytest.mark.integration

PREFIX = "gpu:"


def _generate(spec: Spec, root: Path) -> Path:
    directory, kept = write_family_cases(spec, root, PREFIX)
    assert kept > 0, kept
    return directory


def _variant() -> Spec:
    spec = load_spec().spec
    changes = {
        "node_label": "kubernetes_node",
        "dcgm_node_label": "node",
        "ignore_xids": (13, 31),
        "nvlink_errors": 10,
        "resource": "amd.com/gpu",
    }
    gpu = Gpu.model_validate({**spec.gpu.model_dump(), **changes})
    return spec.model_copy(update={"gpu": gpu})


@pytest.mark.parametrize("variant", ["default", "renamed labels, ignored XIDs, NVLink threshold"])
def test_the_gpu_cases_pass(tmp_path: Path, variant: str) -> None:
    spec = load_spec().spec if variant == "default" else _variant()
    result = run_family_cases(_generate(spec, tmp_path))
    assert result.ok, result.output


@pytest.mark.parametrize(
    ("original", "broken", "failing_case"),
    [
        # the temperature threshold ignored
        ('"(.+)")) > 85', '"(.+)")) > 200', "over max_temperature_celsius"),
        # a drain-now XID replaced by a later one no longer counts
        (
            f"expr: max_over_time({catalog.GPU_XID_DRAIN_RECORD}[10m])",
            f"expr: {catalog.GPU_XID_DRAIN_RECORD}",
            "replaced by a later one",
        ),
        # XID 79 (fallen off the bus) is no longer drain-now
        (f"      or {catalog.GPU_XID_LAST_RECORD} == 79\n", "", "a drain-now XID fires"),
        # an unknown Ready status no longer counts as NotReady
        ('status=~"false|unknown"', 'status=~"false"', "NotReady (false or unknown)"),
        # nodes without GPUs page too
        (
            f"and on (node) ({catalog.GPU_NODE_CAPACITY_RECORD} > 0)\n    for: 2m",
            f"or on (node) ({catalog.GPU_NODE_CAPACITY_RECORD} > 0)\n    for: 2m",
            "NotReady (false or unknown)",
        ),
        # one restart is a crash loop
        (") >= 3", ") >= 1", "restarting"),
        # the watch ticket while the drain-now alert holds
        (
            f"unless max_over_time({catalog.GPU_XID_DRAIN_RECORD}[10m])",
            f"or max_over_time({catalog.GPU_XID_DRAIN_RECORD}[10m])",
            "replaced by a later one",
        ),
    ],
)
def test_the_gpu_cases_catch_a_broken_rule(
    tmp_path: Path, original: str, broken: str, failing_case: str
) -> None:
    directory = _generate(load_spec().spec, tmp_path)
    result = run_with_broken_rule(directory, original, broken)
    assert not result.ok
    assert failing_case in result.output
