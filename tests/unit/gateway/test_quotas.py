"""Quota maths (retry-after, elastic factor, limit choice), tenants, the token estimator, and
the spec's validation of the quotas section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.gateway.quotas import (
    QuotaConfigError,
    TenantResolver,
    bucket_key,
    elastic_factor,
    load_quotas_file,
    pick_limit,
    retry_after,
)
from redline.gateway.tokens import (
    CompletionQuantiles,
    TokenEstimator,
    TokenizerConfigError,
    WordEstimator,
    error_ratio,
    load_tokenizer,
)
from redline.slo.load import SpecError, default_spec_text, parse_spec
from redline.slo.spec import Quotas

LIMITS: dict[str, Any] = {
    "models": ["big", "small"],
    "limits": [
        {"intent": "sql", "tokens_per_minute": 800, "safety_buffer_tokens": 300},
        {"intent": "*", "tokens_per_minute": 5000},
        {"tenant": "acme", "intent": "sql", "tokens_per_minute": 100},
        {"intent": "sql", "model": "small", "tokens_per_minute": 50},
        {
            "intent": "summarise",
            "tokens_per_minute": 2000,
            "overflow": "downgrade",
            "downgrade_to": "small",
        },
    ],
}


def test_the_most_specific_limit_wins() -> None:
    quotas = Quotas.model_validate(LIMITS)
    assert pick_limit(quotas, "globex", "sql", "big").tokens_per_minute == 800  # type: ignore[union-attr]
    assert pick_limit(quotas, "acme", "sql", "big").tokens_per_minute == 100  # type: ignore[union-attr]
    assert pick_limit(quotas, "globex", "sql", "small").tokens_per_minute == 50  # type: ignore[union-attr]
    assert pick_limit(quotas, "globex", "chat", "big").tokens_per_minute == 5000  # type: ignore[union-attr]
    assert pick_limit(Quotas(), "globex", "chat", "big") is None


def test_bucket_keys_carry_the_tenant_as_the_cluster_hash_tag() -> None:
    limit = Quotas.model_validate(LIMITS).limits[0]
    assert bucket_key("redline:quota:", "acme", limit) == "redline:quota:{acme}:sql:*"


def test_retry_after_is_the_refill_time_of_the_shortfall() -> None:
    # 800 tokens/min = 13.3/s; 100 left, 500 needed: 400 short -> 30 s.
    assert retry_after(100, 500, 0, 800, 800 / 60) == 30
    # An overdraft allowance (floor) shortens the wait.
    assert retry_after(100, 500, 200, 800, 800 / 60) == 15
    # Never less than a second.
    assert retry_after(499.9, 500, 0, 800, 800 / 60) == 1
    # A request larger than the bucket ever holds waits for a full bucket.
    assert retry_after(-100, 5000, 0, 800, 800 / 60) == 68


def test_the_elastic_factor_grows_with_the_prompt_and_is_capped_at_2() -> None:
    quotas = Quotas()
    assert elastic_factor(quotas, 0) == 1.0
    assert elastic_factor(quotas, 500) == pytest.approx(1.3)
    assert elastic_factor(quotas, 100_000) == 2.0


def test_tenants_come_from_the_key_file_then_the_header_then_the_default(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"sk-acme": "acme", "sk-globex": "globex"}))
    quotas = Quotas.model_validate({"tenants": {"api_keys_file": str(keys)}})
    tenants = TenantResolver(quotas, max_labels=1)
    assert tenants.resolve({"authorization": "Bearer sk-acme"}) == "acme"
    assert tenants.resolve({"x-api-key": "sk-globex"}) == "globex"
    assert tenants.resolve({"authorization": "Bearer nope", "x-redline-tenant": "t1"}) == "t1"
    assert tenants.resolve({"x-redline-tenant": "bad tenant!"}) == "anonymous"
    assert tenants.resolve({}) == "anonymous"
    # Header tenants are bounded as label values; configured ones are always kept.
    assert tenants.label("t1") == "t1"
    assert tenants.label("t2") == "other"
    assert tenants.label("globex") == "globex"


def test_an_unreadable_keys_file_names_the_setting(tmp_path: Path) -> None:
    quotas = Quotas.model_validate({"tenants": {"api_keys_file": str(tmp_path / "none")}})
    with pytest.raises(QuotaConfigError, match="quotas.tenants.api_keys_file: .*cannot read"):
        TenantResolver(quotas)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    quotas = Quotas.model_validate({"tenants": {"api_keys_file": str(listed)}})
    with pytest.raises(QuotaConfigError, match="mapping of API key -> tenant"):
        TenantResolver(quotas)


def _spec_with(quotas: dict[str, Any]) -> str:
    data = yaml.safe_load(default_spec_text())
    data["quotas"] = quotas
    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        (
            {"intent": "summary", "tokens_per_minute": 10},
            "spec.yaml: quotas.limits[0].intent: unknown intent 'summary'; allowed: "
            "summarise, translate, code, sql, chat, extraction, *",
        ),
        (
            {"intent": "sql", "tokens_per_minute": 10, "overflow": "downgrade"},
            "overflow: downgrade needs downgrade_to",
        ),
        (
            {"intent": "sql", "tokens_per_minute": 10, "overflow": "downgrade",
             "downgrade_to": "tiny"},
            "quotas.limits.0.downgrade_to: unknown model 'tiny'; allowed: big, small",
        ),
        (
            {"intent": "sql", "tokens_per_minute": 10, "model": "huge"},
            "quotas.limits.0.model: unknown model 'huge'; allowed: big, small",
        ),
    ],
)  # fmt: skip
def test_a_quota_naming_an_unknown_intent_or_model_is_rejected(
    limit: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec(_spec_with({"models": ["big", "small"], "limits": [limit]}), "spec.yaml")
    assert message in str(raised.value)


def test_the_elastic_cap_is_2x_at_most() -> None:
    with pytest.raises(SpecError, match=r"quotas.elastic.max_factor"):
        parse_spec(_spec_with({"elastic": {"max_factor": 3}}), "spec.yaml")


def test_a_quotas_file_is_validated_like_the_spec(tmp_path: Path) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text(
        yaml.safe_dump({"quotas": {"limits": [{"intent": "poem", "tokens_per_minute": 1}]}})
    )
    with pytest.raises(QuotaConfigError, match=r"quotas.yaml: quotas.limits.0.intent: .*'poem'"):
        load_quotas_file(path)
    path.write_text("limits: []\n")
    with pytest.raises(QuotaConfigError, match="expected a mapping with a quotas: section"):
        load_quotas_file(path)


def test_the_word_estimator_learns_the_upstreams_tokenizer() -> None:
    words = WordEstimator()
    assert words.count("Hello, world! How are you?") == 6  # 5 words + 3 punctuation x 0.5
    assert words.count("请把这份文件发给我") == 9  # one per CJK character
    assert words.count("") == 0
    raw = words.count("Hello, world! How are you?")
    for _ in range(60):
        words.learn("m", raw, 5)  # this upstream counts words only
    assert words.calibrated("m", raw) == 5
    assert words.calibrated("other", raw) == raw


def test_expected_completion_is_the_intents_running_quantile_capped_by_max_tokens() -> None:
    quantiles = CompletionQuantiles(0.9, 256)
    assert quantiles.expected("sql", None) == 256
    assert quantiles.expected("sql", 64) == 64
    for tokens in range(1, 101):
        quantiles.observe("sql", tokens)
    assert 85 <= quantiles.expected("sql", None) <= 95
    assert quantiles.expected("sql", 50) == 50
    assert quantiles.expected("chat", None) == 256


def test_estimates_and_error_ratio() -> None:
    estimator = TokenEstimator(None, 0.9, 32)
    payload = {"messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 8}
    estimate = estimator.estimate(payload, "m", "chat", 8)
    assert (estimate.prompt, estimate.completion, estimate.total) == (4, 8, 12)
    assert error_ratio(12, 10) == pytest.approx(0.2)
    assert error_ratio(5, 0) is None


def test_a_tokenizer_file_that_fails_to_load_names_the_setting_and_file(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json")
    with pytest.raises(TokenizerConfigError, match=rf"tokenizer_file: {broken}: cannot load"):
        load_tokenizer(None, broken)
    with pytest.raises(TokenizerConfigError, match="not 'tiktoken:<encoding>'"):
        load_tokenizer("sentencepiece:x", None)
    assert load_tokenizer(None, None) is None


def test_a_real_tokenizers_file_counts_tokens(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    model = tokenizers.models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    counter = load_tokenizer(None, path)
    assert counter is not None and counter.count("hello world again") == 3
