"""Snapshot artifacts for the registry tests: a LoRA-like adapter directory and a config file."""

from __future__ import annotations

import json
from pathlib import Path

MODEL = "org/chat-7b"


def make_artifacts(base: Path, version: str) -> tuple[Path, Path]:
    """A LoRA-like adapter directory (weights) and a config file for one version."""
    weights = base / f"adapter-{version}"
    weights.mkdir(parents=True)
    (weights / "adapter_model.safetensors").write_bytes(f"weights of {version}".encode() * 1000)
    (weights / "nested").mkdir()
    (weights / "nested" / "extra.bin").write_bytes(b"\x00\x01" * 10)
    config = base / f"config-{version}.json"
    config.write_text(json.dumps({"r": 8, "version": version}))
    return weights, config
