"""KEK wrapping on a real PKCS#11 token (SoftHSM2): round trip, and clear errors for a wrong
KEK label, a wrong PIN, a wrong token label, a missing module and a token without a user PIN;
SoftHSM2 never locks a PIN (it keeps no retry counter), which is shown here too."""

from __future__ import annotations

import secrets
from pathlib import Path

import pkcs11.exceptions as p11
import pytest
from pkcs11 import TokenFlag

from redline.platform.weights.errors import (
    KekNotFoundError,
    KeyModuleError,
    KeyWrapError,
    TokenLoginError,
    TokenNotFoundError,
    UnwrapError,
)
from redline.platform.weights.keys import (
    Pkcs11KeyWrapper,
    create_pkcs11_kek,
    load_pkcs11_module,
    open_pkcs11_key_wrapper,
)
from tests.integration.platform.weights.conftest import KEK_A, KEK_B, NO_USER_PIN, hsm_settings
from tests.support.softhsm import SoftHsmToken


def test_wrap_round_trip_and_the_kek_only_wraps(wrapper: Pkcs11KeyWrapper) -> None:
    dek = secrets.token_bytes(32)
    blob = wrapper.wrap(dek)
    assert blob != dek and len(blob) == 40  # RFC 5649: 32 bytes + the 8-byte integrity block
    assert wrapper.unwrap(blob) == dek
    assert wrapper.wrap(dek) == blob  # key wrap is deterministic: no IV to manage
    assert wrapper.kek_id == f"pkcs11:token=redline-test;object={KEK_A}"
    damaged = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(UnwrapError, match="the wrong KEK or a damaged blob"):
        wrapper.unwrap(damaged)
    with pytest.raises(KeyWrapError, match="32 bytes"):
        wrapper.wrap(b"short")


def test_a_blob_of_another_kek_is_refused(
    wrapper: Pkcs11KeyWrapper, hsm_token: SoftHsmToken
) -> None:
    blob = wrapper.wrap(secrets.token_bytes(32))
    wrapper.close()
    with open_pkcs11_key_wrapper(hsm_settings(hsm_token, KEK_B)) as other:
        with pytest.raises(UnwrapError, match=KEK_B):
            other.unwrap(blob)


def test_wrong_kek_label_names_it_and_the_token(hsm_token: SoftHsmToken) -> None:
    with pytest.raises(KekNotFoundError) as caught:
        open_pkcs11_key_wrapper(hsm_settings(hsm_token, "no-such-kek"))
    assert "'no-such-kek'" in str(caught.value) and "'redline-test'" in str(caught.value)
    assert "kek_label" in str(caught.value)
    # The failed open logged nothing in: the next open works.
    open_pkcs11_key_wrapper(hsm_settings(hsm_token)).close()


def test_wrong_pin_is_refused(hsm_token: SoftHsmToken) -> None:
    with pytest.raises(TokenLoginError, match="'redline-test' refused the PIN"):
        open_pkcs11_key_wrapper(hsm_settings(hsm_token, pin="0000"))


def test_second_login_in_one_process_is_explained(
    wrapper: Pkcs11KeyWrapper, hsm_token: SoftHsmToken
) -> None:
    with pytest.raises(TokenLoginError, match="logged in already"):
        open_pkcs11_key_wrapper(hsm_settings(hsm_token))


def test_wrong_token_and_missing_module(hsm_token: SoftHsmToken, tmp_path: Path) -> None:
    settings = hsm_settings(hsm_token)
    with pytest.raises(TokenNotFoundError, match="'nope'.*token_label"):
        open_pkcs11_key_wrapper(settings.model_copy(update={"token_label": "nope"}))
    missing = tmp_path / "libnothing.so"
    with pytest.raises(KeyModuleError, match=f"{missing} does not exist.*module_path"):
        open_pkcs11_key_wrapper(settings.model_copy(update={"module_path": missing}))
    not_a_module = tmp_path / "fake.so"
    not_a_module.write_bytes(b"not an ELF file")
    with pytest.raises(KeyModuleError, match="cannot be loaded"):
        open_pkcs11_key_wrapper(settings.model_copy(update={"module_path": not_a_module}))


def test_creating_an_existing_kek_is_refused(hsm_token: SoftHsmToken) -> None:
    with pytest.raises(KeyWrapError, match="already"):
        create_pkcs11_kek(hsm_settings(hsm_token, KEK_A))


def _flags(token: SoftHsmToken, label: str) -> TokenFlag:
    library = load_pkcs11_module(token.module_path)
    return TokenFlag(library.get_token(token_label=label).flags)


def test_a_token_without_a_user_pin_names_the_token_and_the_fix(hsm_token: SoftHsmToken) -> None:
    settings = hsm_settings(hsm_token).model_copy(update={"token_label": NO_USER_PIN})
    assert not _flags(hsm_token, NO_USER_PIN) & TokenFlag.USER_PIN_INITIALIZED
    # What SoftHSM2 itself answers a login there: CKR_USER_PIN_NOT_INITIALIZED.
    token = load_pkcs11_module(hsm_token.module_path).get_token(token_label=NO_USER_PIN)
    with pytest.raises(p11.UserPinNotInitialized):
        token.open(user_pin=hsm_token.pin)
    with pytest.raises(TokenLoginError) as caught:
        open_pkcs11_key_wrapper(settings)
    message = str(caught.value)
    assert f"token {NO_USER_PIN!r} has no user PIN" in message
    assert "security officer must set one (C_InitPIN)" in message and "setting pin" in message
    with pytest.raises(TokenLoginError, match="has no user PIN"):
        create_pkcs11_kek(settings.model_copy(update={"kek_label": "k"}))


def test_softhsm2_reports_failed_logins_but_never_locks_the_pin(hsm_token: SoftHsmToken) -> None:
    # HSMs that lock do so after 3 to 10 failures; SoftHSM2 keeps no counter at all.
    for _ in range(12):
        with pytest.raises(TokenLoginError) as caught:
            open_pkcs11_key_wrapper(hsm_settings(hsm_token, pin="0000"))
        # The token's own warning, read after the failure: SoftHSM2 sets COUNT_LOW on each.
        assert "refused the PIN (setting pin)" in str(caught.value)
        assert "CKF_USER_PIN_COUNT_LOW" in str(caught.value)
    flags = _flags(hsm_token, hsm_token.label)
    assert flags & TokenFlag.USER_PIN_COUNT_LOW
    assert not flags & (TokenFlag.USER_PIN_LOCKED | TokenFlag.USER_PIN_FINAL_TRY)
    # The right PIN still logs in, and clears the flag.
    open_pkcs11_key_wrapper(hsm_settings(hsm_token)).close()
    assert not _flags(hsm_token, hsm_token.label) & TokenFlag.USER_PIN_COUNT_LOW
