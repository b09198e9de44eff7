"""The local stack's quotas and the quota drill's traffic fit each other: the file validates
against the stack's models, the load generator's tenant has no limit, the burst's prompts are
classified as summarisation and overflow the batch bucket well within the burst."""

from __future__ import annotations

from redline.devstack.config import LOCAL_QUOTAS_FILE, build_gateway_settings
from redline.devstack.drills.quota import BURST, summarise_prompt
from redline.devstack.drills.registry import DRILL_ORDER, DRILLS
from redline.devstack.layout import ADAPTER, BASE_MODEL, build_endpoints, build_ported_parts
from redline.gateway.intent import build_default_classifier
from redline.gateway.quotas import elastic_factor, load_quotas_file, pick_limit
from redline.gateway.tokens import TokenEstimator
from redline.slo.spec import INTENT_NAMES


def test_the_local_quotas_name_the_stacks_models_and_leave_the_load_generator_alone() -> None:
    quotas = load_quotas_file(LOCAL_QUOTAS_FILE)
    assert quotas.enabled and set(quotas.models) == {ADAPTER, BASE_MODEL}
    downgrade = pick_limit(quotas, "batch", "summarise", ADAPTER)
    reject = pick_limit(quotas, "batch", "summarise", BASE_MODEL)
    assert downgrade is not None and downgrade.overflow == "downgrade"
    assert downgrade.downgrade_to == BASE_MODEL and downgrade.tokens_per_minute == 2000
    assert reject is not None and reject.overflow == "reject"
    for intent in INTENT_NAMES:  # the load generator sends no tenant header
        for model in (ADAPTER, BASE_MODEL):
            assert pick_limit(quotas, quotas.tenants.default, intent, model) is None


def test_the_stacks_gateway_runs_them() -> None:
    regions = ("primary", "secondary")
    ports = {part: 21000 + i for i, part in enumerate(build_ported_parts(regions))}
    settings = build_gateway_settings(build_endpoints(ports, regions), None)
    assert settings["quotas_file"] == str(LOCAL_QUOTAS_FILE)


def test_the_burst_is_summarisation_and_overflows_the_batch_bucket() -> None:
    quotas = load_quotas_file(LOCAL_QUOTAS_FILE)
    classifier = build_default_classifier()
    estimator = TokenEstimator(None)
    payload = {"messages": [{"role": "user", "content": summarise_prompt(3)}], "max_tokens": 64}
    assert classifier.classify(payload) == "summarise"
    estimate = estimator.estimate(payload, ADAPTER, "summarise", 64)
    limit = pick_limit(quotas, "batch", "summarise", BASE_MODEL)
    assert limit is not None
    overdraft = (elastic_factor(quotas, estimate.prompt) - 1.0) * limit.capacity
    fits = int((limit.capacity + overdraft) // estimate.total) + 1
    # A refill of 2000 tokens/min adds under one request while the burst runs: most overflow.
    assert 1 <= fits < BURST // 2, (estimate, fits)


def test_the_drill_is_registered_and_runs_with_all() -> None:
    assert "quota" in DRILLS and "quota" in DRILL_ORDER
