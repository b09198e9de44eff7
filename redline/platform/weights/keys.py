"""KEK wrappers: the key-encryption key lives in an HSM (PKCS#11) or in AWS KMS and only ever
wraps and unwraps data-encryption keys (DEKs); it never sees weights.

`Pkcs11KeyWrapper` wraps with CKM_AES_KEY_WRAP_PAD (RFC 5649) through C_WrapKey/C_UnwrapKey.
Chosen over AES-GCM because the KEK then needs only CKA_WRAP/CKA_UNWRAP — `create_pkcs11_kek`
makes it with CKA_ENCRYPT/CKA_DECRYPT off, so the token refuses to use it on anything but keys —
and RFC 5649's integrity check rejects a wrong KEK or a damaged blob without an IV to manage.
SoftHSM 2.6.1 (Debian's softhsm2) lists both CKM_AES_KEY_WRAP_PAD and CKM_AES_GCM; the test
token is SoftHSM2, production tokens (Luna, nShield, CloudHSM) support the same mechanism.

PKCS#11 keeps the login state per application and token, not per session: one process holds
one logged-in wrapper per token (a second `open_pkcs11_key_wrapper` on it gets a clear
TokenLoginError); share it between threads (calls are serialised) and `close()` it.

An unusable token fails before any key is touched, with a TokenLoginError (TokenNotFoundError
for one that is gone) naming the token's label and the setting or the action that fixes it
(`check_token_flags` reads the token's flags first, so a locked PIN is not tried again):

- no user PIN initialised (CKR_USER_PIN_NOT_INITIALIZED, or the flag CKF_USER_PIN_INITIALIZED
  off): the token's security officer must set one (C_InitPIN);
- user PIN locked (CKR_PIN_LOCKED, CKF_USER_PIN_LOCKED): the security officer must unlock it
  (C_InitPIN), no value of `pin` works until then;
- user PIN expired or to be changed (CKR_PIN_EXPIRED, CKF_USER_PIN_TO_BE_CHANGED);
- a wrong PIN (CKR_PIN_INCORRECT): the message adds the token's own warning when it reports few
  tries left (CKF_USER_PIN_COUNT_LOW, CKF_USER_PIN_FINAL_TRY);
- a token removed, not present or not recognised (CKR_TOKEN_NOT_PRESENT, CKR_DEVICE_REMOVED,
  CKR_TOKEN_NOT_RECOGNIZED), or in an error state (CKF_ERROR_STATE).

What SoftHSM2 (2.6.1, the test token) does of these: a token initialised with an SO PIN only
(C_InitToken without C_InitPIN) has no user PIN, and its C_Login answers
CKR_USER_PIN_NOT_INITIALIZED; a wrong PIN answers CKR_PIN_INCORRECT and sets
CKF_USER_PIN_COUNT_LOW (a right PIN clears it). It never locks a PIN: it keeps no retry
counter, never sets CKF_USER_PIN_LOCKED or CKF_USER_PIN_FINAL_TRY and never answers
CKR_PIN_LOCKED (src/lib/slot_mgr/Token.cpp, `Token::loginUser`), so the locked-PIN path is
tested against the flags and answers HSMs that do lock (after 3 to 10 failures, by vendor)
document, not against SoftHSM2.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, cast

import boto3
import pkcs11
import pkcs11.exceptions as p11
from botocore.exceptions import BotoCoreError, ClientError
from pkcs11 import Attribute, KeyType, Mechanism, MechanismFlag, ObjectClass, TokenFlag
from pkcs11.types import UnwrapMixin, WrapMixin

from redline.platform.weights.errors import (
    KekNotFoundError,
    KeyModuleError,
    KeyWrapError,
    TokenLoginError,
    TokenNotFoundError,
    UnwrapError,
)
from redline.platform.weights.settings import KmsSettings, Pkcs11Settings

if TYPE_CHECKING:
    from mypy_boto3_kms.client import KMSClient
    from pkcs11._pkcs11 import lib as Pkcs11Library

DEK_BYTES = 32
"""AES-256."""
WRAP_MECHANISM = Mechanism.AES_KEY_WRAP_PAD
KMS_CONTEXT = {"redline": "weights-dek"}
"""The KMS encryption context every wrap binds: a blob unwraps only with the same context."""


class KeyWrapper(Protocol):
    """Wraps and unwraps DEKs with a KEK that never leaves its HSM or KMS."""

    @property
    def kek_id(self) -> str:
        """Names the KEK (recorded with every wrapped DEK)."""
        ...

    def wrap(self, dek: bytes) -> bytes:
        """The DEK wrapped by the KEK."""
        ...

    def unwrap(self, blob: bytes) -> bytes:
        """The DEK from its wrapped blob; UnwrapError if the KEK rejects it."""
        ...


def pkcs11_kek_id(token_label: str, kek_label: str) -> str:
    """The RFC 7512 style id of a PKCS#11 KEK (`pkcs11:token=...;object=...`), recorded with
    every DEK it wraps."""
    return f"pkcs11:token={token_label};object={kek_label}"


def check_token_flags(label: str, flags: TokenFlag) -> None:
    """TokenLoginError naming the token and the fix when its flags say no user can log in:
    not initialised, no user PIN, the user PIN locked, or the token in an error state (pure)."""
    if not flags & TokenFlag.TOKEN_INITIALIZED:
        raise TokenLoginError(
            f"token {label!r} is not initialised (C_InitToken; for SoftHSM2: softhsm2-util "
            "--init-token): initialise it and make the KEK, or fix setting token_label"
        )
    if flags & TokenFlag.ERROR_STATE:
        raise TokenLoginError(
            f"token {label!r} reports an error state (CKF_ERROR_STATE): it cannot be used until "
            "its vendor's tools clear it (or fix setting token_label)"
        )
    if not flags & TokenFlag.USER_PIN_INITIALIZED:
        raise TokenLoginError(_no_user_pin(label))
    if flags & TokenFlag.USER_PIN_LOCKED:
        raise TokenLoginError(_locked(label))


def _no_user_pin(label: str) -> str:
    return (
        f"token {label!r} has no user PIN (CKF_USER_PIN_INITIALIZED off): its security officer "
        "must set one (C_InitPIN) before setting pin can log in"
    )


def _locked(label: str) -> str:
    return (
        f"token {label!r}: the user PIN is locked (too many wrong PINs): its security officer "
        "must unlock it (C_InitPIN); no value of setting pin works until then"
    )


def _pin_warning(flags: TokenFlag) -> str:
    if flags & TokenFlag.USER_PIN_FINAL_TRY:
        return "; the token says one more wrong PIN locks it (CKF_USER_PIN_FINAL_TRY)"
    if flags & TokenFlag.USER_PIN_COUNT_LOW:
        return "; the token reports failed logins (CKF_USER_PIN_COUNT_LOW): it may lock the PIN"
    return ""


def _check_dek(dek: bytes) -> None:
    if len(dek) != DEK_BYTES:
        raise KeyWrapError(f"a DEK is {DEK_BYTES} bytes (AES-256), got {len(dek)}")


def load_pkcs11_module(module_path: Path) -> Pkcs11Library:
    """The PKCS#11 library; KeyModuleError naming the path when it is missing or no module."""
    if not module_path.is_file():
        raise KeyModuleError(
            f"PKCS#11 module {module_path} does not exist (setting module_path; for SoftHSM2: "
            "apt-get install softhsm2)"
        )
    try:
        return pkcs11.lib(str(module_path))
    except p11.PKCS11Error as exc:
        raise KeyModuleError(
            f"PKCS#11 module {module_path} cannot be loaded (setting module_path): {exc}"
        ) from None


def _open_session(settings: Pkcs11Settings, rw: bool) -> tuple[pkcs11.Token, pkcs11.Session]:
    library = load_pkcs11_module(settings.module_path)
    label = settings.token_label
    token = _get_token(library, settings)
    check_token_flags(label, token.flags)
    try:
        session = token.open(rw=rw, user_pin=settings.pin.get_secret_value())
    except (p11.PinIncorrect, p11.PinInvalid, p11.PinLenRange):
        # The flags after the failure: a token that counts failures says how close it is.
        warning = _pin_warning(_get_token(library, settings).flags)
        raise TokenLoginError(f"token {label!r} refused the PIN (setting pin){warning}") from None
    except p11.PinLocked:
        raise TokenLoginError(_locked(label)) from None
    except p11.PinExpired:
        raise TokenLoginError(
            f"token {label!r}: the user PIN has expired: change it (C_SetPIN) and update "
            "setting pin"
        ) from None
    except p11.UserPinNotInitialized:
        raise TokenLoginError(_no_user_pin(label)) from None
    except (p11.TokenNotPresent, p11.TokenNotRecognised, p11.DeviceRemoved) as exc:
        raise TokenNotFoundError(_gone(label, settings, exc)) from None
    except (p11.UserAlreadyLoggedIn, p11.AnotherUserAlreadyLoggedIn):
        raise TokenLoginError(
            f"token {label!r}: this process is logged in already (PKCS#11 login is per process "
            "and token): share the open Pkcs11KeyWrapper, or close it first"
        ) from None
    except p11.PKCS11Error as exc:
        raise TokenLoginError(f"token {label!r}: cannot open a session: {exc!r}") from None
    return token, session


def _gone(label: str, settings: Pkcs11Settings, exc: Exception) -> str:
    return (
        f"token {label!r} in {settings.module_path} is not usable: {type(exc).__name__} "
        "(removed, not present or not recognised; setting token_label)"
    )


def _get_token(library: Pkcs11Library, settings: Pkcs11Settings) -> pkcs11.Token:
    label = settings.token_label
    try:
        return library.get_token(token_label=label)
    except p11.NoSuchToken:
        raise TokenNotFoundError(
            f"no PKCS#11 token labelled {label!r} in {settings.module_path} (setting token_label)"
        ) from None
    except p11.MultipleTokensReturned:
        raise TokenNotFoundError(f"several PKCS#11 tokens are labelled {label!r}") from None
    except (p11.TokenNotPresent, p11.TokenNotRecognised, p11.DeviceRemoved) as exc:
        raise TokenNotFoundError(_gone(label, settings, exc)) from None


class _Kek(WrapMixin, UnwrapMixin):
    """What the KEK must be: a key the token lets wrap and unwrap."""


def _find_kek(session: pkcs11.Session, settings: Pkcs11Settings) -> _Kek:
    try:
        key = session.get_key(
            object_class=ObjectClass.SECRET_KEY, key_type=KeyType.AES, label=settings.kek_label
        )
    except p11.NoSuchKey:
        raise KekNotFoundError(
            f"token {settings.token_label!r} has no AES key labelled {settings.kek_label!r} "
            "(setting kek_label)"
        ) from None
    except p11.MultipleObjectsReturned:
        raise KekNotFoundError(
            f"token {settings.token_label!r} has several AES keys labelled {settings.kek_label!r}"
        ) from None
    if not isinstance(key, WrapMixin) or not isinstance(key, UnwrapMixin):
        raise KekNotFoundError(
            f"{settings.kek_label!r} on {settings.token_label!r} cannot wrap and unwrap keys"
        )
    return cast(_Kek, key)


class Pkcs11KeyWrapper:
    """A KEK on a PKCS#11 token; `open_pkcs11_key_wrapper` makes one, `close()` ends it."""

    def __init__(
        self,
        session: pkcs11.Session,
        kek: _Kek,
        settings: Pkcs11Settings,
        lock: threading.Lock | None = None,
        owner: bool = True,
    ) -> None:
        self._session = session
        self._kek = kek
        self._settings = settings
        self._lock = lock or threading.Lock()  # a PKCS#11 session runs one operation at a time
        self._owner = owner
        self._closed = False

    def with_kek(self, kek_label: str) -> Pkcs11KeyWrapper:
        """A wrapper of another KEK on the same token, sharing this login (for a KEK rotation:
        one process logs in to a token once); closing it leaves this one open."""
        settings = self._settings.model_copy(update={"kek_label": kek_label})
        with self._lock:
            self._check_open()
            kek = _find_kek(self._session, settings)
        return Pkcs11KeyWrapper(self._session, kek, settings, self._lock, owner=False)

    @property
    def kek_id(self) -> str:
        """An RFC 7512 style name of the KEK: `pkcs11:token=...;object=...`."""
        return pkcs11_kek_id(self._settings.token_label, self._settings.kek_label)

    def wrap(self, dek: bytes) -> bytes:
        """C_WrapKey of the DEK (imported as a session object, destroyed after)."""
        _check_dek(dek)
        with self._lock:
            self._check_open()
            try:
                obj = self._session.create_object(
                    {
                        Attribute.CLASS: ObjectClass.SECRET_KEY,
                        Attribute.KEY_TYPE: KeyType.AES,
                        Attribute.VALUE: dek,
                        Attribute.TOKEN: False,
                        Attribute.SENSITIVE: False,
                        Attribute.EXTRACTABLE: True,
                    }
                )
                try:
                    key = obj if isinstance(obj, pkcs11.SecretKey) else None
                    if key is None:
                        raise KeyWrapError("the token did not import the DEK as a secret key")
                    return bytes(self._kek.wrap_key(key, mechanism=WRAP_MECHANISM))
                finally:
                    obj.destroy()
            except p11.PKCS11Error as exc:
                raise KeyWrapError(f"{self.kek_id}: cannot wrap a DEK: {exc!r}") from None

    def unwrap(self, blob: bytes) -> bytes:
        """C_UnwrapKey into a session object, its value read, the object destroyed."""
        with self._lock:
            self._check_open()
            try:
                key = self._kek.unwrap_key(
                    ObjectClass.SECRET_KEY,
                    KeyType.AES,
                    blob,
                    mechanism=WRAP_MECHANISM,
                    store=False,
                    template={Attribute.SENSITIVE: False, Attribute.EXTRACTABLE: True},
                )
            except p11.PKCS11Error as exc:
                raise UnwrapError(
                    f"{self.kek_id} rejected a wrapped DEK ({len(blob)} bytes): the wrong KEK or "
                    f"a damaged blob ({type(exc).__name__})"
                ) from None
            try:
                value = bytes(key[Attribute.VALUE])
            finally:
                key.destroy()
        _check_dek(value)
        return value

    def _check_open(self) -> None:
        if self._closed:
            raise KeyWrapError(f"{self.kek_id}: the wrapper was closed")

    def close(self) -> None:
        """Close the session (the last one logs the process out of the token); idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._owner:
                    self._session.close()

    def __enter__(self) -> Pkcs11KeyWrapper:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_pkcs11_key_wrapper(settings: Pkcs11Settings) -> Pkcs11KeyWrapper:
    """Log in to the token and find the KEK; the errors name the module, token or label."""
    token, session = _open_session(settings, rw=True)
    try:
        mechanisms = token.slot.get_mechanisms()
        if WRAP_MECHANISM not in mechanisms:
            raise KeyWrapError(
                f"token {settings.token_label!r} does not offer CKM_AES_KEY_WRAP_PAD"
            )
        kek = _find_kek(session, settings)
    except BaseException:
        session.close()
        raise
    return Pkcs11KeyWrapper(session, kek, settings)


def create_pkcs11_kek(settings: Pkcs11Settings) -> str:
    """Generate the KEK on the token (AES-256, never extractable, wrap/unwrap only); its id.
    KeyWrapError when a key with that label exists already."""
    _, session = _open_session(settings, rw=True)
    try:
        try:
            _find_kek(session, settings)
        except KekNotFoundError:
            pass
        else:
            raise KeyWrapError(
                f"token {settings.token_label!r} has a key labelled {settings.kek_label!r} already"
            )
        session.generate_key(
            KeyType.AES,
            256,
            label=settings.kek_label,
            store=True,
            capabilities=MechanismFlag.WRAP | MechanismFlag.UNWRAP,
            template={
                Attribute.SENSITIVE: True,
                Attribute.EXTRACTABLE: False,
                Attribute.ENCRYPT: False,
                Attribute.DECRYPT: False,
            },
        )
    except p11.PKCS11Error as exc:
        raise KeyWrapError(
            f"token {settings.token_label!r}: cannot create the KEK: {exc!r}"
        ) from None
    finally:
        session.close()
    return pkcs11_kek_id(settings.token_label, settings.kek_label)


class AwsKmsKeyWrapper:
    """A KMS key wrapping DEKs with Encrypt/Decrypt (the DEK is made locally; KMS never stores
    it). The encryption context `KMS_CONTEXT` is bound to every blob.

    Tested only with botocore's Stubber (tests/unit/platform/weights/test_kms.py): it checks
    every request's parameters against the real KMS service model shipped with botocore, but no
    KMS server answers, so the error codes mapped here are the documented ones, not observed.
    """

    def __init__(self, client: KMSClient, key_id: str) -> None:
        self.client = client
        self.key_id = key_id

    @property
    def kek_id(self) -> str:
        """`kms:<key id, ARN or alias>`."""
        return f"kms:{self.key_id}"

    def _error(self, action: str, exc: Exception) -> KeyWrapError:
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            message = str(exc.response.get("Error", {}).get("Message", ""))
            if code == "NotFoundException":
                return KekNotFoundError(f"KMS has no key {self.key_id!r} (setting key_id)")
            if code in {"InvalidCiphertextException", "IncorrectKeyException"}:
                return UnwrapError(f"{self.kek_id} rejected a wrapped DEK: {code}: {message}")
            return KeyWrapError(f"{self.kek_id}: cannot {action}: {code}: {message}")
        return KeyWrapError(f"{self.kek_id}: cannot {action}: {exc}")

    def wrap(self, dek: bytes) -> bytes:
        """KMS Encrypt of the DEK."""
        _check_dek(dek)
        try:
            answer = self.client.encrypt(
                KeyId=self.key_id, Plaintext=dek, EncryptionContext=KMS_CONTEXT
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error("wrap a DEK", exc) from None
        return bytes(answer["CiphertextBlob"])

    def unwrap(self, blob: bytes) -> bytes:
        """KMS Decrypt of the blob (KeyId given, so a blob of another key is refused)."""
        try:
            answer = self.client.decrypt(
                CiphertextBlob=blob, KeyId=self.key_id, EncryptionContext=KMS_CONTEXT
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error("unwrap a DEK", exc) from None
        value = bytes(answer["Plaintext"])
        _check_dek(value)
        return value


def build_kms_client(settings: KmsSettings, session: boto3.Session | None = None) -> KMSClient:
    """A KMS client for the settings (no request made); credentials from the boto3 chain."""
    session = session or boto3.Session(profile_name=settings.profile)
    return session.client("kms", region_name=settings.region, endpoint_url=settings.endpoint_url)
