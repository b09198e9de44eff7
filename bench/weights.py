"""Encrypted weight shards (#29): encrypt and verify throughput against plain sha256 over the
same bytes, and incremental against full verification of the next version.

Set-up: a real SoftHSM2 token (Debian `softhsm2`) holds the KEK, made through
`create_pkcs11_kek` as an operator would; DEKs are wrapped by it through PKCS#11. Two record
stores, each measured: the embedded default (`FileRecordStore`, a temp dir) and a real S3 API
(SeaweedFS `weed mini` on loopback, a versioned bucket with Object Lock). A model of
`--size-mib` MiB (default 2048, random bytes generated here) is cut into shards of the default
size.

Side by side, over the same file:
- sha256: `hashlib.sha256` over the file in shard-sized reads, the least any integrity check
  costs (the baseline);
- write: `write_shards` (per-shard sha256, AES-256-GCM with its own nonce and tag, the
  objects and the manifest written);
- full verification: `verify_full` (every shard read, its tag checked, decrypted, hashed, and
  the whole file's sha256);
- the next version, which differs from the first in one shard (a fine-tune that touched one
  tensor): `verify_full` of it against `verify_incremental`, which checks only the changed
  shard and reuses the previous version's verdict for the rest.

Incremental verification trusts a reused shard when the store's digest of it still matches:
S3 keeps each object's sha256 checksum (one HeadObject), while a file store must hash the file
again, so there incremental verification saves the decryption but not the reading. On S3 it
costs one HeadObject per reused shard. Target: on S3, incremental verification of a one-shard
change at least twice as fast as full (the HeadObject round trips bound it).

Run: `.venv/bin/python -m bench.weights [--size-mib N] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench.figures import Figure, at_least, check, exit_code, info
from redline.platform.weights.keyring import Keyring
from redline.platform.weights.keys import create_pkcs11_kek, open_pkcs11_key_wrapper
from redline.platform.weights.records import FileRecordStore, RecordStore
from redline.platform.weights.s3store import open_s3_record_store
from redline.platform.weights.settings import Pkcs11Settings, S3StoreSettings, ShardSettings
from redline.platform.weights.shards import verify_full, verify_incremental, write_shards
from tests.support.seaweedfs import make_bucket, seaweedfs
from tests.support.softhsm import softhsm

NAME = "weights"
MODEL = "bench-model"
KEK = "bench-kek"
MIB = 1024 * 1024
T = TypeVar("T")


def _timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    value = call()
    return value, time.perf_counter() - started


def _best(rounds: int, call: Callable[[], T]) -> tuple[T, float]:
    """The result and the median seconds of `rounds` calls (warm page cache after the first)."""
    results = [_timed(call) for _ in range(rounds)]
    return results[-1][0], statistics.median(seconds for _, seconds in results)


def write_model(path: Path, size: int, chunk: int = 64 * MIB) -> None:
    """`size` random bytes (incompressible, as weights are to a cipher)."""
    with path.open("wb") as handle:
        left = size
        while left:
            step = min(chunk, left)
            handle.write(os.urandom(step))
            left -= step


def write_next_version(first: Path, second: Path, shard_size: int) -> None:
    """A copy of `first` whose middle shard differs (one byte per 4 KiB page flipped)."""
    shutil.copyfile(first, second)
    size = first.stat().st_size
    offset = (size // shard_size // 2) * shard_size
    with second.open("r+b") as handle:
        handle.seek(offset)
        block = bytearray(handle.read(min(shard_size, size - offset)))
        for i in range(0, len(block), 4096):
            block[i] ^= 0xFF
        handle.seek(offset)
        handle.write(block)


def sha256_file(path: Path, chunk: int) -> str:
    """The file's sha256 in `chunk`-sized reads."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Measured:
    """One store's timings (median seconds) and reports."""

    store: str
    write: float
    full: float
    write_next: float
    full_next: float
    incremental: float
    ok: bool
    checked_only_changed: bool


def measure(
    label: str, store: RecordStore, keyring: Keyring, first: Path, second: Path, rounds: int
) -> Measured:
    """Write v1, verify it, write v2 on top, verify v2 in full and incrementally."""
    v1, write = _timed(lambda: write_shards(store, keyring, MODEL, "v1", first))
    report_v1, full = _best(rounds, lambda: verify_full(store, keyring, v1))
    v2, write_next = _timed(lambda: write_shards(store, keyring, MODEL, "v2", second, base=v1))
    report_v2, full_next = _best(rounds, lambda: verify_full(store, keyring, v2))
    report_inc, incremental = _best(
        rounds, lambda: verify_incremental(store, keyring, v2, v1, report_v1)
    )
    before = {e.shard_id for e in v1.shards}
    changed = [e.shard_id for e in v2.shards if e.shard_id not in before]
    return Measured(
        label, write, full, write_next, full_next, incremental,
        ok=report_v1.ok and report_v2.ok and report_inc.ok,
        checked_only_changed=report_inc.checked == changed,
    )  # fmt: skip


def run(argv: list[str] | None = None) -> list[Figure]:
    """Write, verify and verify incrementally on both stores; print the table, return figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    size = args.size_mib * MIB
    shard_size = ShardSettings().shard_size
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        root = Path(tmp)
        first, second = root / "v1.safetensors", root / "v2.safetensors"
        write_model(first, size)
        write_next_version(first, second, shard_size)
        _, plain = _best(args.rounds, lambda: sha256_file(first, shard_size))
        with (
            softhsm(root / "softhsm") as (token,),
            seaweedfs(root / "seaweedfs") as seaweed,
        ):
            settings = Pkcs11Settings.model_validate(
                {"module_path": token.module_path, "token_label": token.label,
                 "kek_label": KEK, "pin": token.pin}
            )  # fmt: skip
            create_pkcs11_kek(settings)
            with open_pkcs11_key_wrapper(settings) as wrapper:
                local = FileRecordStore(root / "store")
                results = [
                    measure("file", local, Keyring(local, wrapper), first, second, args.rounds)
                ]
                bucket = make_bucket(seaweed.client(), "bench-weights")
                s3 = open_s3_record_store(
                    S3StoreSettings(endpoint_url=seaweed.endpoint_url, bucket=bucket),
                    seaweed.session(),
                )
                results.append(measure("s3", s3, Keyring(s3, wrapper), first, second, args.rounds))
    mib = size / MIB
    print(f"weights: {mib:.0f} MiB in shards of {shard_size // MIB} MiB; the next version")
    print("differs in one shard. sha256 of the file (the baseline): "
          f"{plain:.3f} s, {mib / plain:.0f} MiB/s")  # fmt: skip
    print(f"{'store':<6}{'path':<36}{'seconds':>10}{'MiB/s':>10}")
    for m in results:
        for label, seconds in (
            ("write_shards (encrypt + store)", m.write),
            ("verify_full", m.full),
            ("write_shards, next version", m.write_next),
            ("verify_full, next version", m.full_next),
            ("verify_incremental, next version", m.incremental),
        ):
            print(f"{m.store:<6}{label:<36}{seconds:>10.3f}{mib / seconds:>10.0f}")
    figures = [info(NAME, "sha256 throughput", round(mib / plain), "MiB/s")]
    for m in results:
        figures += [
            info(NAME, f"{m.store}: encrypt + store vs sha256", round(plain / m.write, 2), "x"),
            info(NAME, f"{m.store}: full verification vs sha256", round(plain / m.full, 2), "x"),
            info(
                NAME, f"{m.store}: incremental vs full", round(m.full_next / m.incremental, 1), "x"
            ),  # fmt: skip
            check(
                NAME,
                f"{m.store}: every verification passed, incremental checked one shard",
                m.ok and m.checked_only_changed,
                "ok",
            ),  # fmt: skip
        ]
    s3 = results[-1]
    figures.append(
        at_least(
            NAME,
            "s3: incremental vs full verification",
            round(s3.full_next / s3.incremental, 1),
            "x",
            2,
        )
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
