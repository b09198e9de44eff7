"""Hallucination mutation (design notes §4.4): a canary's answer changed against its accepted one;
its alerts, and the promtool cases that prove them.

- `OutputConsistencyMutation` (warning, playbook `rollback_candidate`): per model version,
  region and canary, the answer's diff has more than `MIN_CHANGES - 1` changed tokens and a
  mutation score of at least `MIN_SCORE` (the exporter's `exporters/mutation.py`). The diff
  (normalised, truncated by the exporter) is joined from `llm_output_consistency_diff_info`, so
  it is the `diff` label and annotation of the alert; the receiver records the model version as
  a rollback candidate with it.
- `OutputConsistencyMutationRollback` (critical, the spec's `rollback.playbook`): a mutation of
  a model version that also rolls it back. With `rollback.on_mutation: true`, on any mutation;
  otherwise only while the two-signal gate's own conditions hold for that version and
  `rollback.for_seconds` > 0, so the mutation's corroboration acts before the gate's `for` is
  out (with `for_seconds` 0 the gate's own alert already acts at once and a second alert would
  race it for the same rollback, so none is made). Never while `SemanticRollbackTwoSignal`
  already fires for the version: that alert is running the rollback.

`MIN_CHANGES` (4: "more than 3 changes", the notes' first filter) and `MIN_SCORE` (0.25) are
fixed here, not in the spec; the exporter's `short_answer_tokens` shapes the score.
"""

from __future__ import annotations

from redline.rules.common import alert_rule
from redline.rules.families.rollback import VERSION, _gate_series, rollback_gate_expr
from redline.rules.model import RuleGroup, number
from redline.rules.promtool_cases import AlertIndex, Case, constant, expected, series
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

MIN_CHANGES = 4
"""Changed tokens (inserted + deleted) an answer must show: more than three."""
MIN_SCORE = 0.25
"""Mutation score an answer must reach (changed-token ratio, weighted for short answers)."""
MUTATION_FOR_SECONDS = 0
"""The exporter keeps comparing with the accepted answer, so a mutation stays in the series
until an answer is accepted; the first evaluation that sees it fires (recording a candidate
changes nothing on the platform)."""
CANDIDATE_PLAYBOOK = "rollback_candidate"
GATE_ALERT = Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL
ROLLBACK_ALERT = Alert.OUTPUT_CONSISTENCY_MUTATION_ROLLBACK
"""The mutation of a model version that rolls it back (before the gate's `for` is out, or on
any mutation with `rollback.on_mutation`)."""
KEY = (catalog.LABEL_MODEL, catalog.LABEL_MODEL_VERSION, catalog.LABEL_REGION, "prompt")


def mutation_condition() -> str:
    """Canary answers that mutated: enough changed tokens and a high enough score."""
    return (
        f"{catalog.LLM_OUTPUT_MUTATION_SCORE} >= {number(MIN_SCORE)}\n"
        f"and {catalog.LLM_OUTPUT_CONSISTENCY_CHANGES} >= {MIN_CHANGES}"
    )


def mutation_expr() -> str:
    """The mutation alert: the condition, with the exporter's `diff` label joined on."""
    on = f"on ({', '.join(KEY)}) group_left (diff)"
    return f"(\n{mutation_condition()}\n)\n* {on}\n{catalog.LLM_OUTPUT_CONSISTENCY_DIFF_INFO}"


def rollback_expr(spec: Spec) -> str | None:
    """The mutation-triggered rollback's expression, or None when the spec makes none."""
    version = "on (model, model_version)"
    mutated = f"max by (model, model_version) (\n{mutation_condition()}\n)"
    gate_firing = f'ALERTS{{alertname="{GATE_ALERT}", alertstate="firing"}}'
    if spec.rollback.on_mutation:
        return f"{mutated}\nunless {version}\n{gate_firing}"
    if spec.rollback.for_seconds <= 0:
        return None
    return (
        f"{mutated}\nand {version}\n(\n{rollback_gate_expr(spec)}\n)\n"
        f"unless {version}\n{gate_firing}"
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The mutation alert, and the rollback it triggers where the spec asks for one."""
    rules = [
        alert_rule(
            spec,
            Alert.OUTPUT_CONSISTENCY_MUTATION,
            mutation_expr(),
            MUTATION_FOR_SECONDS,
            "warning",
            "Model {{ $labels.model }} version {{ $labels.model_version }} changed its answer "
            "to canary {{ $labels.prompt }} in {{ $labels.region }}",
            "The canary's answer differs from the accepted one (mutation score "
            "{{ $value | humanize }}, at least "
            f"{MIN_CHANGES} changed tokens after normalisation): "
            "{{ $labels.diff }}. Recorded as a rollback candidate.",
            CANDIDATE_PLAYBOOK,
        )
    ]
    expr = rollback_expr(spec)
    if expr is not None:
        why = (
            "rollback.on_mutation is set"
            if spec.rollback.on_mutation
            else "the two-signal gate's conditions hold too"
        )
        rules.append(
            alert_rule(
                spec,
                ROLLBACK_ALERT,
                expr,
                0,
                "critical",
                "Model {{ $labels.model }} version {{ $labels.model_version }} mutated its "
                "canary answers: rolling back",
                f"A canary answer of the version mutated and {why}: roll back to the last "
                "verified snapshot.",
                spec.rollback.playbook,
            )
        )
    return [RuleGroup("redline-mutation", spec.timing.evaluation_interval_seconds, tuple(rules))]


CANARY = {**VERSION, "region": "primary", "prompt": "capital-france"}
DIFF = "-the capital of france +i believe it | -paris +lyon"


def _mutation_series(changes: float, score: float, steps: int, diff: bool = True) -> dict[str, str]:
    out = {
        series(catalog.LLM_OUTPUT_CONSISTENCY_CHANGES, CANARY): constant(changes, steps),
        series(catalog.LLM_OUTPUT_MUTATION_SCORE, CANARY): constant(score, steps),
    }
    if diff:
        labels = {**CANARY, "diff": DIFF}
        out[series(catalog.LLM_OUTPUT_CONSISTENCY_DIFF_INFO, labels)] = constant(1, steps)
    return out


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """A mutation fires with its diff; too few changes, too low a score, an unchanged answer stay
    silent; the rollback fires as the spec says (on_mutation, gate, never beside the gate)."""
    rule = alerts.get(Alert.OUTPUT_CONSISTENCY_MUTATION)
    fires = [expected(rule, {**CANARY, "diff": DIFF}, 0.818182)]
    cases = [
        ("a short answer with 9 changed tokens fires, diff attached", 9, 0.818182, fires),
        (f"{MIN_CHANGES - 1} changed tokens stay silent", MIN_CHANGES - 1, 0.9, []),
        ("a low score (long answer) stays silent", 12, MIN_SCORE - 0.01, []),
        ("an unchanged answer stays silent", 0, 0.0, []),
    ]
    out = [
        Case(
            f"output mutation: {title}",
            _mutation_series(changes, score, 10, diff=changes > 0),
            300,
            [(Alert.OUTPUT_CONSISTENCY_MUTATION, expected_alerts)],
        )
        for title, changes, score, expected_alerts in cases
    ]
    out.extend(_rollback_cases(spec, alerts))
    return out


def _rollback_cases(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """The mutation-triggered rollback, for the variant the spec builds."""
    name = ROLLBACK_ALERT
    mutated = _mutation_series(9, 0.818182, 20)
    if rollback_expr(spec) is None:
        return [
            Case(
                "output mutation: no rollback of its own without on_mutation or a gate `for`",
                mutated,
                300,
                [(name, [])],
            )
        ]
    rule = alerts.get(name)
    fires = [expected(rule, VERSION, 0.818182)]
    if spec.rollback.on_mutation:
        return [
            Case(
                "output mutation: on_mutation rolls back on a mutation alone",
                mutated,
                300,
                [(name, fires)],
            ),  # fmt: skip
        ]
    gate = spec.rollback
    base_p99, base_acc = 0.5, 0.9
    slow = base_p99 * (1 + gate.p99_increase_ratio) * 1.2
    down = base_acc - gate.accuracy_drop * 2
    enough, verdicts = gate.min_samples * 2, gate.min_eval_samples * 2
    both = {**_gate_series(spec, slow, base_p99, down, base_acc, enough, verdicts), **mutated}
    quiet_gate = _gate_series(spec, slow, base_p99, base_acc, base_acc, enough, verdicts)
    # Inside the gate's `for` (from its first evaluation) the mutation acts; once the gate
    # fires itself, the rollback is left to it.
    early = 0
    late = int(gate.for_seconds) + 300
    steps = late // 60 + 5
    return [
        Case(
            "output mutation: a mutation while the gate holds rolls back before its `for`",
            both,
            early,
            [(name, fires), (GATE_ALERT, [])],
        ),  # fmt: skip
        Case(
            "output mutation: a mutation without the gate's conditions does not roll back",
            {**quiet_gate, **mutated},
            early,
            [(name, [])],
        ),  # fmt: skip
        Case(
            "output mutation: once the gate fires, its own alert rolls back, not this one",
            {k: v.replace("+0x20", f"+0x{steps}") for k, v in both.items()},
            late,
            [(name, [])],
        ),  # fmt: skip
    ]
