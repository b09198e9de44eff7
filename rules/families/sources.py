"""The source's one recording of its own: each model's active version, where it is joined.

An engine profile's series are read where they are, mapped onto the catalog's labels inside
each aggregation (`redline.rules.signals`); what the engine cannot say is which version of a
model serves, so `model_version` is joined from the snapshot registry's active version after the
aggregation. This family records that join key once per evaluation, first in the rule file, so
every version-joined rule of the evaluation sees the same versions. For redline's gateway, which
stamps every request with its version itself, and for a profile naming a version label of its
own, the family emits no group.

No alert of its own, hence no promtool case: the families that read engine series prove the
mapping and the join end to end from the engine's raw series (`promtool_cases` writes them per
profile).
"""

from __future__ import annotations

from redline.rules.model import RecordingRule, RuleGroup
from redline.rules.promtool_cases import AlertIndex, Case
from redline.rules.signals import active_version_expr
from redline.slo import catalog
from redline.slo.spec import Spec

GROUP = "redline-sources"


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The `redline-sources` group with the active-version record; none where versions are
    not joined from the registry (the gateway)."""
    if not spec.sources.resolve().version_from_registry():
        return []
    rule = RecordingRule(catalog.MODEL_ACTIVE_VERSION_RECORD, active_version_expr(spec))
    return [RuleGroup(GROUP, spec.timing.evaluation_interval_seconds, (rule,))]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """None: the join is proven by the cases of the alerts that read engine series."""
    return []
