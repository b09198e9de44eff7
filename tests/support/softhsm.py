"""A real PKCS#11 token for tests: SoftHSM2 (Debian package softhsm2, 2.6.1 when written) with
its own SOFTHSM2_CONF and token directory in a temp dir, tokens made by `softhsm2-util
--init-token --free`.

The module reads SOFTHSM2_CONF once, when a process first loads it (C_Initialize), and
python-pkcs11 keeps it loaded: `softhsm` sets the variable for the whole `with` block, so a test
session uses one token directory; make every token it needs before the first load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


@contextmanager
def softhsm(
    workdir: Path, labels: tuple[str, ...] = ("redline-test",), pin: str = "1234"
) -> Iterator[list[SoftHsmToken]]:
    """Tokens in a temp config, SOFTHSM2_CONF pointing at it for the block (restored after)."""
    conf = write_conf(workdir)
    tokens = [init_token(conf, label, pin, "5678") for label in labels]
    before = os.environ.get("SOFTHSM2_CONF")
    os.environ["SOFTHSM2_CONF"] = str(conf)
    try:
        yield tokens
    finally:
        if before is None:
            os.environ.pop("SOFTHSM2_CONF", None)
        else:
            os.environ["SOFTHSM2_CONF"] = before
