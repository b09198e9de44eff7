"""The *Model and drift* dashboard: active versions, the two-signal rollback gate drawn against
each version's baseline, embedding drift, token throughput and time to first token."""

from __future__ import annotations

from dataclasses import replace

from grafanalib.core import Dashboard

from redline.dashboards.panels import (
    NO_THRESHOLD,
    AnnotationDef,
    DashboardDef,
    PanelDef,
    Query,
    Section,
    alert_runbook,
    alerts_annotation,
    assemble,
    bad_above,
    bad_below,
    model_matcher,
    region_matcher,
    source_description,
)
from redline.rules.families.rollback import rollback_gate_expr
from redline.rules.model import number
from redline.rules.records import (
    rollback_records,
    rollback_window,
    tokens_rate_records,
    ttft_p99_record,
)
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

SLUG = "model-drift"
TOKENS_UNIT = "suffix: tok/s"
THRESHOLD_UNIT = "suffix:× threshold"


def active_versions_expr() -> str:
    """One series per model and the version it serves (value 1)."""
    return f"max by (model, version) ({catalog.MODEL_ACTIVE_INFO}{{{model_matcher()}}})"


def version_switch_annotation() -> AnnotationDef:
    """A mark where a model starts serving a version it did not serve one interval earlier."""
    active = active_versions_expr()
    offset = active.replace("}", "} offset $__interval", 1)
    return AnnotationDef(
        name="Version switches",
        expr=f"{active}\nunless\n{offset}",
        title="{{model}} now serves {{version}}",
        text="{{model}} switched to version {{version}}",
        tags="model,version",
        color="blue",
    )


def _versions(spec: Spec) -> Section:
    gate = spec.rollback
    book = alert_runbook(spec, Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL)
    records = rollback_records(spec)
    window = rollback_window(spec)
    by = "max by (model, model_version)"
    ratio = number(1 + gate.p99_increase_ratio)
    drop = number(gate.accuracy_drop)
    baseline_p99 = catalog.MODEL_BASELINE_P99_SECONDS
    baseline_accuracy = catalog.MODEL_BASELINE_ACCURACY_RATIO
    active = Query(active_versions_expr(), "{{model}}: {{version}}")
    p99 = (
        Query(f"{records['p99']}{{{model_matcher()}}}", "P99 {{model}} {{model_version}}"),
        Query(
            f"{by} ({baseline_p99}{{{model_matcher()}}})",
            "baseline {{model_version}}",
        ),
        Query(
            f"{ratio} * {by} ({baseline_p99}{{{model_matcher()}}})",
            f"gate: {ratio} × baseline {{{{model_version}}}}",
        ),
    )
    confidence = number(gate.confidence * 100)
    upper = records["accuracy_upper"]
    accuracy = (
        Query(
            f"{records['accuracy']}{{{model_matcher()}}}", "accuracy {{model}} {{model_version}}"
        ),
        # The gate's accuracy leg compares this bound, not the point estimate: it fires only
        # when even the optimistic end of the interval is below the line.
        Query(
            f"{by} ({upper}{{{model_matcher()}}})",
            f"Wilson upper bound ({confidence} %) {{{{model_version}}}}",
        ),
        Query(
            f"{by} ({baseline_accuracy}{{{model_matcher()}}})",
            "baseline {{model_version}}",
        ),
        Query(
            f"{by} ({baseline_accuracy}{{{model_matcher()}}}) - {drop}",
            f"gate: baseline − {number(gate.accuracy_drop * 100)} pts {{{{model_version}}}}",
        ),
    )
    requests = Query(f"{records['requests']}{{{model_matcher()}}}", "{{model}} {{model_version}}")
    verdicts = Query(
        f"{by} ({records['verdicts']}{{{model_matcher()}}})",
        "{{model}} {{model_version}}",
    )
    holding = Query(f"count(\n{rollback_gate_expr(spec)}\n)\nor vector(0)", "versions")
    return Section(
        "Model versions and the two-signal rollback gate",
        (
            PanelDef("stat", "Active version", (active,), book, stat_text="name", width=6),
            PanelDef("state", "Active version over time", (active,), book, width=12),
            PanelDef(
                "stat",
                "Versions the gate fires on",
                (holding,),
                book,
                "short",
                bad_above(1),
                width=6,
            ),  # fmt: skip
            PanelDef(
                "timeseries",
                f"P99 over {window} vs baseline (gate +{number(gate.p99_increase_ratio * 100)} %)",
                p99,
                book,
                "s",
                width=8,
            ),  # fmt: skip
            PanelDef(
                "timeseries",
                f"Accuracy over {window} vs baseline (gate −"
                f"{number(gate.accuracy_drop * 100)} pts at {confidence} %)",
                accuracy,
                book,
                "percentunit",
                width=8,
                description=(
                    f"The accuracy leg fires when the Wilson score upper bound of the accuracy "
                    f"({confidence} % one-sided, from the verdicts in {window}) is more than "
                    f"{number(gate.accuracy_drop * 100)} points under the version's baseline, "
                    f"with at least {gate.min_eval_samples} verdicts."
                ),
            ),
            PanelDef(
                "timeseries",
                f"Accuracy verdicts in {window} (gate needs {gate.min_eval_samples})",
                (verdicts,),
                book,
                "short",
                bad_below(gate.min_eval_samples),
                width=4,
            ),  # fmt: skip
            PanelDef(
                "timeseries",
                f"Requests in {window} (gate needs {gate.min_samples})",
                (requests,),
                book,
                "short",
                bad_below(gate.min_samples),
                width=4,
            ),  # fmt: skip
        ),
    )


def _drift(spec: Spec) -> Section:
    book = alert_runbook(spec, Alert.EMBEDDING_DRIFT)
    by = "max by (collection, method)"
    drift_score, drift_threshold = catalog.EMBEDDING_DRIFT_SCORE, catalog.EMBEDDING_DRIFT_THRESHOLD
    score = Query(f"{by} ({drift_score})", "{{collection}} {{method}}")
    threshold = Query(f"{by} ({drift_threshold})", "threshold {{collection}}")
    relative = Query(
        f"max by (collection) ({drift_score} / on (collection, method) {drift_threshold})",
        "{{collection}}",
    )
    samples = Query(
        f"max by (collection) ({catalog.EMBEDDING_DRIFT_WINDOW_SAMPLES})", "{{collection}}"
    )
    return Section(
        f"Embedding drift ({spec.drift.method}, window {spec.drift.window})",
        (
            PanelDef(
                "stat", "Drift score / threshold", (relative,), book, THRESHOLD_UNIT, bad_above(1)
            ),  # fmt: skip
            PanelDef("timeseries", "Drift score vs threshold", (score, threshold), book, width=12),
            PanelDef(
                "stat", "Vectors in the latest window", (samples,), book, "short", NO_THRESHOLD
            ),  # fmt: skip
        ),
    )


TOKENS = "Tokens/s"
TTFT_P99 = "TTFT P99"


def serving_left_out(spec: Spec) -> dict[str, str]:
    """The serving panels this spec's source cannot fill (title -> why)."""
    profile = spec.sources.resolve().profile
    left_out = {}
    if not tokens_rate_records(spec):
        left_out[TOKENS] = "the source publishes no token counters"
    if ttft_p99_record(spec) is None:
        why = profile.missing.get("time_to_first_token", "the source publishes no TTFT histogram")
        left_out[TTFT_P99] = why
    return left_out


def _serving(spec: Spec) -> Section:
    book = alert_runbook(spec, Alert.RED_LINE_LATENCY_P99)
    labels = f"{model_matcher()},{region_matcher('served_region')}"
    window = spec.red_lines.latency_p99.window
    tokens = tuple(
        Query(
            f"sum by (served_region, model) ({record}{{{labels}}})",
            f"{kind} {{{{served_region}}}} {{{{model}}}}",
        )
        for kind, record in tokens_rate_records(spec).items()
    )
    panels = []
    if tokens:
        panels.append(PanelDef("timeseries", f"{TOKENS} ({window})", tokens, book, TOKENS_UNIT))
    ttft_record = ttft_p99_record(spec)
    if ttft_record is not None:
        ttft = Query(
            f"max by (served_region, model) ({ttft_record}{{{labels}}})",
            "{{served_region}} {{model}}",
        )
        panels.append(PanelDef("timeseries", f"{TTFT_P99} ({window})", (ttft,), book, "s"))
    # A panel that can never have data reads like a broken exporter: one the source cannot
    # fill is left out (the description says why) and the others share the row.
    width = 24 // max(1, len(panels))
    return Section("Serving", tuple(replace(panel, width=width) for panel in panels))


def build_model_drift_definition(spec: Spec) -> DashboardDef:
    """The model-and-drift dashboard as data."""
    return DashboardDef(
        slug=SLUG,
        title="Model and drift",
        description=(
            "Which version each model serves, its P99 and accuracy (with the Wilson bound the "
            "gate compares and the verdict count) against the version's verified baseline with "
            "the two-signal rollback gate drawn, embedding drift, tokens per second and the "
            "time to first token." + source_description(spec, serving_left_out(spec))
        ),
        sections=(_versions(spec), _drift(spec), _serving(spec)),
        annotations=(
            version_switch_annotation(),
            alerts_annotation(
                "Rollback and drift alerts",
                f'alertname=~"{Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL}|{Alert.EMBEDDING_DRIFT}"',
                "red",
            ),
        ),
        variables=("region", "model"),
    )


def build_model_drift_dashboard(spec: Spec) -> Dashboard:
    """The model-and-drift dashboard."""
    return assemble(spec, build_model_drift_definition(spec))
