"""The golden set's answer embedding is the same in every process, whatever its hash seed."""

from __future__ import annotations

import os
import subprocess
import sys

from redline.platform.golden import embed


def test_embedding_does_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "from redline.platform.golden import embed;"
        "print(','.join(f'{x:.12f}' for x in embed('17 + 25 = 42.')))"
    )
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(result.stdout)
    here = ",".join(f"{x:.12f}" for x in embed("17 + 25 = 42."))
    assert outputs == {here + "\n"}
