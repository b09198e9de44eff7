"""The *Error budgets* dashboard: per SLO remaining budget, burn rates per window pair, and the
time left until the budget is gone. A grouped SLO draws one series per group, filtered by a
variable per group label."""

from __future__ import annotations

from grafanalib.core import Dashboard

from redline.dashboards.panels import (
    DashboardDef,
    PanelDef,
    Query,
    Section,
    Step,
    alert_and_remediation_annotations,
    alert_runbook,
    assemble,
    bad_above,
    bad_below,
    variable_matcher,
)
from redline.rules.families.slo import BURN_WINDOWS, burn_factor
from redline.rules.model import format_duration, number, selector
from redline.slo import catalog
from redline.slo.spec import GROUP_LABELS, Slo, Spec, parse_duration

SLUG = "error-budgets"
BURN_UNIT = "suffix:×"


def exhaustion_window_seconds() -> int:
    """The window whose burn rate projects the exhaustion time: the fastest page's long one."""
    return min(w.long_seconds for w in BURN_WINDOWS if w.severity == "page")


def slo_selector(slo: Slo) -> str:
    """`{slo="<name>"}`, and a grouped SLO's group labels as their variables filter them."""
    return selector({"slo": slo.name}, *(variable_matcher(label) for label in slo.group_by))


def group_legend(slo: Slo) -> str:
    """A grouped SLO's legend: its group labels (`{{model}}`); '' for an ungrouped SLO."""
    return " ".join(f"{{{{{label}}}}}" for label in slo.group_by)


def group_variables(spec: Spec) -> tuple[str, ...]:
    """Every label some SLO is grouped by, in the spec's label order."""
    used = {label for slo in spec.slos for label in slo.group_by}
    return tuple(label for label in GROUP_LABELS if label in used)


def burn_rate_expr(slo: Slo, window_seconds: int) -> str:
    """The burn rate of `slo` over a window: its error ratio over the budget (1 = sustainable)."""
    budget = number(1 - slo.objective)
    sel = slo_selector(slo)
    return f"{catalog.slo_errors_record(format_duration(window_seconds))}{sel} / {budget}"


def exhaustion_expr(slo: Slo) -> str:
    """Seconds until the remaining budget is gone at the current burn rate, capped at the period.

    Not burning at all would be +Inf, which a stat shows as nothing useful; any time beyond the
    period means the same thing to an operator (the budget outlasts it), so it reads as the period.
    """
    period = number(parse_duration(slo.period))
    sel = slo_selector(slo)
    burn = burn_rate_expr(slo, exhaustion_window_seconds())
    remaining = catalog.SLO_ERROR_BUDGET_REMAINING_RECORD
    on = ", ".join(("slo", *slo.group_by))  # one budget per group: matched group by group
    projected = f"clamp_min({remaining}{sel}, 0) * {period}\n/ on ({on})\n({burn})"
    return f"clamp_max(\n{projected},\n{period}\n)"


def _slo_section(spec: Spec, slo: Slo) -> Section:
    book = alert_runbook(spec, slo.burn_alert_name)
    period = parse_duration(slo.period)
    fastest = max(burn_factor(w, period) for w in BURN_WINDOWS if w.severity == "page")
    objective = f"{number(slo.objective * 100)} % over {slo.period}"
    group = group_legend(slo)
    remaining = Query(
        f"{catalog.SLO_ERROR_BUDGET_REMAINING_RECORD}{slo_selector(slo)}", group or "remaining"
    )
    exhaustion = Query(exhaustion_expr(slo), group or "at the current burn rate")
    # Red: gone sooner than the fastest page burn empties a full budget; orange: within a period.
    exhaustion_steps = (Step("red", None), Step("orange", period / fastest), Step("green", period))
    panels = [
        PanelDef(
            "stat",
            f"{slo.name}: budget left ({objective})",
            (remaining,),
            book,
            "percentunit",
            bad_below(0),
        ),  # fmt: skip
        PanelDef(
            "stat",
            f"{slo.name}: time to exhaustion "
            f"(at the {format_duration(exhaustion_window_seconds())} burn rate)",
            (exhaustion,),
            book,
            "s",
            exhaustion_steps,
        ),
        PanelDef(
            "timeseries",
            f"{slo.name}: budget left",
            (remaining,),
            book,
            "percentunit",
            bad_below(0),
            width=12,
        ),  # fmt: skip
    ]
    for window in BURN_WINDOWS:
        factor = burn_factor(window, period)
        long_w, short_w = (
            format_duration(window.long_seconds),
            format_duration(window.short_seconds),
        )
        panels.append(
            PanelDef(
                "timeseries",
                f"{slo.name}: burn rate {long_w}/{short_w} ({window.severity} at "
                f"{number(round(factor, 2))}×)",
                (
                    Query(burn_rate_expr(slo, window.long_seconds), f"{group} {long_w}".strip()),
                    Query(burn_rate_expr(slo, window.short_seconds), f"{group} {short_w}".strip()),
                ),
                book,
                BURN_UNIT,
                bad_above(factor),
                description=(
                    f"Pages or tickets when both windows burn faster than {number(factor)}× "
                    f"(the {slo.period} budget would be gone in "
                    f"{format_duration(int(period / factor))})."
                ),
            )
        )
    return Section(f"SLO {slo.name} ({objective})", tuple(panels))


def build_error_budgets_definition(spec: Spec) -> DashboardDef:
    """The error-budget dashboard as data."""
    return DashboardDef(
        slug=SLUG,
        title="Error budgets",
        description=(
            "Per SLO of the spec: the budget left over its period, the burn rate in each "
            "multiwindow pair of the burn-rate alerts, and the time until the budget is gone."
        ),
        sections=tuple(_slo_section(spec, slo) for slo in spec.slos),
        annotations=alert_and_remediation_annotations("Burn-rate alerts", 'slo!=""', "orange"),
        variables=(),
        group_variables=group_variables(spec),
    )


def build_error_budgets_dashboard(spec: Spec) -> Dashboard:
    """The error-budget dashboard."""
    return assemble(spec, build_error_budgets_definition(spec))
