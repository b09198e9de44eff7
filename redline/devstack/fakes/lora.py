"""LoRA adapters as the simulator serves them (vLLM's runtime LoRA API): a served model, an
adapter's version read from its path, and the checks of loading one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from redline.devstack.fakes.faults import VERSION


@dataclass(frozen=True)
class ServedModel:
    """A model the simulator serves: the base model or a loaded LoRA adapter."""

    name: str
    version: str
    path: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))


class AdapterError(Exception):
    """An adapter cannot be loaded: the HTTP status and vLLM's error type to answer with."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def adapter_version(lora_path: str) -> str:
    """The version of the adapter at `lora_path`: its `version` file, else the last component."""
    path = Path(lora_path)
    version_file = path / "version"
    if version_file.is_file():
        lines = version_file.read_text("utf-8", errors="replace").strip().splitlines()
        if lines and lines[0].strip():
            return lines[0].strip()
    return path.name or str(path)


def load_adapter(name: str, lora_path: str) -> ServedModel:
    """The adapter `name` served from `lora_path` (AdapterError when it cannot be)."""
    if not name or not lora_path:
        raise AdapterError(
            400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."
        )
    if not Path(lora_path).is_dir():
        raise AdapterError(404, "NotFoundError", f"No adapter found for {lora_path}")
    version = adapter_version(lora_path)
    if not VERSION.match(version):
        raise AdapterError(
            400,
            "InvalidUserInput",
            f"adapter version {version!r} (from {lora_path}) must be 1-128 visible ASCII "
            "characters",
        )
    return ServedModel(name=name, version=version, path=lora_path)
