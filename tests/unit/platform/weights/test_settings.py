"""Settings of the weights adapters: bad values name the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from redline.platform.weights.settings import (
    KeyringSettings,
    Pkcs11Settings,
    S3StoreSettings,
    ShardSettings,
)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("bucket", "No_Caps", "not a valid S3 bucket name"),
        ("bucket", "ab", "not a valid S3 bucket name"),
        ("endpoint_url", "127.0.0.1:8333", "must look like http"),
        ("prefix", "/abs/", "must be empty or like"),
        ("prefix", "no-slash", "must be empty or like"),
        ("region", "", "at least 1"),
        ("surprise", 1, "Extra inputs"),
    ],
)
def test_bad_s3_settings_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        S3StoreSettings.model_validate({"bucket": "weights-eu", field: value})
    assert field in str(caught.value) and message in str(caught.value)


def test_defaults() -> None:
    settings = S3StoreSettings(bucket="weights-eu", prefix="redline/")
    assert not settings.allow_unlocked and settings.endpoint_url is None
    assert ShardSettings().shard_size == 4 * 1024 * 1024
    assert KeyringSettings().name == "default"
    with pytest.raises(ValidationError, match="shard_size"):
        ShardSettings(shard_size=100)


def test_the_pin_stays_out_of_reprs() -> None:
    settings = Pkcs11Settings.model_validate(
        {"token_label": "t", "kek_label": "k", "pin": "secret-pin"}
    )
    assert "secret-pin" not in repr(settings) and "secret-pin" not in str(settings)
    assert settings.pin.get_secret_value() == "secret-pin"
