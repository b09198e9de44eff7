"""A real PKCS#11 token for tests: SoftHSM2 (Debian package softhsm2, 2.6.1 when written) with
its own SOFTHSM2_CONF and token directory in a temp dir, tokens made by `softhsm2-util
--init-token --free`, and tokens with an SO PIN but no user PIN made by C_InitToken alone
(`init_token_without_user_pin`: softhsm2-util always sets a user PIN, prompting for one).

The module reads SOFTHSM2_CONF once, when a process first loads it (C_Initialize), and
python-pkcs11 keeps it loaded: `softhsm` sets the variable for the whole `with` block, so a test
session uses one token directory; make every token it needs before the first load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MODULE = Path("/usr/lib/softhsm/libsofthsm2.so")


@dataclass(frozen=True)
class SoftHsmToken:
    """An initialised token: the module that serves it, its label, the PINs and the config."""

    module_path: Path
    label: str
    pin: str
    so_pin: str
    conf: Path


def _util() -> str:
    found = shutil.which("softhsm2-util")
    if not found or not MODULE.is_file():
        raise RuntimeError(
            "SoftHSM2 not installed; install it with: apt-get update && apt-get install -y softhsm2"
        )
    return found


def write_conf(workdir: Path) -> Path:
    """A softhsm2.conf with a token directory of its own under `workdir`."""
    tokens = workdir / "tokens"
    tokens.mkdir(parents=True, exist_ok=True)
    conf = workdir / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    return conf


def init_token(conf: Path, label: str, pin: str, so_pin: str) -> SoftHsmToken:
    """`softhsm2-util --init-token --free` under `conf`; the token."""
    subprocess.run(
        [_util(), "--init-token", "--free", "--label", label, "--pin", pin, "--so-pin", so_pin],
        env={**os.environ, "SOFTHSM2_CONF": str(conf)},
        check=True,
        capture_output=True,
        timeout=30,
    )
    return SoftHsmToken(MODULE, label, pin, so_pin, conf)


# C_InitToken on SoftHSM2's free slot (always the last one), run in a process of its own: the
# module reads SOFTHSM2_CONF once per process, and the test process must load it only after
# every token exists. ctypes calls the module's exported C_* functions directly.
_INIT_TOKEN_ONLY = """
import ctypes, sys
module, label, so_pin = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode()
lib = ctypes.CDLL(module)
ULONG = ctypes.c_ulong
for name in ("C_Initialize", "C_Finalize", "C_GetSlotList", "C_InitToken"):
    getattr(lib, name).restype = ULONG
def check(rv, what):
    if rv:
        raise SystemExit(f"{what}: CKR 0x{rv:x}")
check(lib.C_Initialize(None), "C_Initialize")
count = ULONG(0)
check(lib.C_GetSlotList(ctypes.c_ubyte(0), None, ctypes.byref(count)), "C_GetSlotList")
slots = (ULONG * count.value)()
check(lib.C_GetSlotList(ctypes.c_ubyte(0), slots, ctypes.byref(count)), "C_GetSlotList")
padded = ctypes.create_string_buffer(label.ljust(32), 32)
check(lib.C_InitToken(slots[count.value - 1], so_pin, ULONG(len(so_pin)), padded), "C_InitToken")
check(lib.C_Finalize(None), "C_Finalize")
"""


def init_token_without_user_pin(conf: Path, label: str, so_pin: str) -> SoftHsmToken:
    """A token initialised with an SO PIN only (C_InitToken, no C_InitPIN): no user can log in
    until its security officer sets a user PIN. Its `pin` is empty."""
    _util()  # the same "not installed" message
    subprocess.run(
        [sys.executable, "-c", _INIT_TOKEN_ONLY, str(MODULE), label, so_pin],
        env={**os.environ, "SOFTHSM2_CONF": str(conf)},
        check=True,
        capture_output=True,
        timeout=30,
    )
    return SoftHsmToken(MODULE, label, "", so_pin, conf)


@contextmanager
def softhsm(
    workdir: Path,
    labels: tuple[str, ...] = ("redline-test",),
    pin: str = "1234",
    without_user_pin: tuple[str, ...] = (),
) -> Iterator[list[SoftHsmToken]]:
    """Tokens in a temp config, SOFTHSM2_CONF pointing at it for the block (restored after):
    `labels` with the user PIN `pin`, then `without_user_pin` with an SO PIN only."""
    conf = write_conf(workdir)
    tokens = [init_token(conf, label, pin, "5678") for label in labels]
    tokens += [init_token_without_user_pin(conf, label, "5678") for label in without_user_pin]
    before = os.environ.get("SOFTHSM2_CONF")
    os.environ["SOFTHSM2_CONF"] = str(conf)
    try:
        yield tokens
    finally:
        if before is None:
            os.environ.pop("SOFTHSM2_CONF", None)
        else:
            os.environ["SOFTHSM2_CONF"] = before
