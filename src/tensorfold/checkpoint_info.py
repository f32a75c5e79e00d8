"""A checkpoint folder's JSON files, read in one place: `config.json` (the model, checked by
config.ModelConfig) and `generation_config.json` (end ids, sampling defaults, reply limit).
Every reader of a folder's settings goes through `CheckpointInfo.open`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    config: dict[str, Any]  # config.json as written
    generation: dict[str, Any] = field(default_factory=dict)  # generation_config.json, or {}

    @classmethod
    def open(cls, path: str | Path) -> CheckpointInfo:
        """The folder's files; ConfigError naming the folder when it has no config.json or a
        file is not JSON."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path}: no config.json (is this a checkpoint folder?)")
        return cls(path, _read(path / "config.json"), generation_config(path))


def generation_config(path: str | Path) -> dict[str, Any]:
    """A folder's generation_config.json, or {} without one (a tokenizer folder may lack the
    model's config.json but carry this)."""
    file = Path(path) / "generation_config.json"
    return _read(file) if file.is_file() else {}


def _read(file: Path) -> dict[str, Any]:
    try:
        raw = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: must hold a JSON object")
    return raw
