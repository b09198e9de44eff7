"""Settings shared by every long-running command: flags, `REDLINE_*` env vars and `--config FILE`.

Precedence, highest first: command-line flags, environment (`REDLINE_*`), the `--config` YAML
file, defaults. Secrets come from files or the environment, never from argv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

S = TypeVar("S", bound="ServiceSettings")


class SettingsError(Exception):
    """Settings that cannot be used; the message names the file or variable and the field."""


class ServiceSettings(BaseSettings):
    """Base settings of a redline service; subclasses add their own fields."""

    model_config = SettingsConfigDict(env_prefix="REDLINE_", extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(0, ge=0, le=65535, description="Port to listen on (0: the service default).")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis for state and stores.")
    spec: Path | None = Field(None, description="Spec file; the embedded default when unset.")
    profile: str | None = Field(None, description="Timing profile of the spec (e.g. local).")
    log_level: str = Field("info", description="Log level.")


def read_secret(path: Path | None, env_value: SecretStr | None, what: str) -> SecretStr | None:
    """A secret from a file (stripped) or an env-provided value; SettingsError if unreadable."""
    if path is not None:
        try:
            text = path.read_text("utf-8").strip()
        except OSError as exc:
            raise SettingsError(f"{what}: cannot read {path}: {exc.strerror}") from None
        if not text:
            raise SettingsError(f"{what}: {path} is empty")
        return SecretStr(text)
    return env_value


def load_settings_file(config: Path) -> dict[Any, Any]:
    """The mapping a settings YAML file holds (empty file: {}); SettingsError if unusable."""
    try:
        loaded = yaml.safe_load(config.read_text("utf-8"))
    except OSError as exc:
        raise SettingsError(f"{config}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{config}: malformed YAML: {exc}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"{config}: expected a mapping of settings")
    return loaded


def load_settings(cls: type[S], config: Path | None = None, **overrides: Any) -> S:
    """Build `cls` from defaults < config file < environment < explicit (non-None) overrides."""
    file_values: dict[str, Any] = {}
    if config is not None:
        loaded = load_settings_file(config)
        file_values = {str(k).replace("-", "_"): v for k, v in loaded.items()}
    explicit = {k: v for k, v in overrides.items() if v is not None}
    try:
        env_only = cls()
        from_env = env_only.model_dump(exclude_unset=True)
        merged = {**file_values, **from_env, **explicit}
        return cls.model_validate(merged)
    except ValidationError as exc:
        source = str(config) if config else "settings"
        lines = [
            f"{source}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            for err in exc.errors()
        ]
        raise SettingsError("\n".join(lines)) from None
