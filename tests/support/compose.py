"""compose/docker-compose.yml as the compose tests read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
PROFILES = ("demo", "milvus", "longterm", "ha")


def load_compose() -> dict[str, Any]:
    """The parsed compose file."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text("utf-8"))
    return data
