"""An unusable PKCS#11 token, from its flags (pure): the states SoftHSM2 never reaches (a locked
PIN, an error state) and the one it does (no user PIN), each naming the token and the fix."""

from __future__ import annotations

import pytest
from pkcs11 import TokenFlag

from redline.platform.weights.errors import TokenLoginError
from redline.platform.weights.keys import check_token_flags

READY = TokenFlag.TOKEN_INITIALIZED | TokenFlag.USER_PIN_INITIALIZED | TokenFlag.LOGIN_REQUIRED


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (TokenFlag.LOGIN_REQUIRED, "is not initialised (C_InitToken"),
        (READY | TokenFlag.ERROR_STATE, "error state (CKF_ERROR_STATE)"),
        (READY & ~TokenFlag.USER_PIN_INITIALIZED, "has no user PIN"),
        (READY | TokenFlag.USER_PIN_LOCKED, "the user PIN is locked"),
    ],
)
def test_an_unusable_token_names_itself_and_the_fix(flags: TokenFlag, message: str) -> None:
    with pytest.raises(TokenLoginError) as caught:
        check_token_flags("hsm-a", flags)
    assert "token 'hsm-a'" in str(caught.value) and message in str(caught.value)


def test_a_locked_pin_says_no_pin_works_until_the_officer_unlocks_it() -> None:
    with pytest.raises(TokenLoginError, match=r"must unlock it \(C_InitPIN\); no value of setting"):
        check_token_flags("hsm-a", READY | TokenFlag.USER_PIN_LOCKED)


def test_a_usable_token_passes_even_with_failed_logins_counted() -> None:
    check_token_flags("hsm-a", READY | TokenFlag.USER_PIN_COUNT_LOW | TokenFlag.USER_PIN_FINAL_TRY)
