"""The bundled demo model: a small Qwen3.5 trained by the project on tasks it generates."""

from __future__ import annotations

from pathlib import Path

from ..errors import TensorFoldError

KINDS = {"bf16": "bf16", "mlx-4bit": "mlx-4bit"}


class DemoMissing(TensorFoldError, FileNotFoundError):
    """The demo checkpoint folder is not installed with the package."""


def demo_checkpoint(kind: str = "bf16") -> Path:
    """Folder of the shipped demo checkpoint: "bf16" (transformers) or "mlx-4bit" (mlx_lm)."""
    if kind not in KINDS:
        raise ValueError(f"demo checkpoint kind {kind!r}: expected one of {sorted(KINDS)}")
    path = Path(__file__).resolve().parent / KINDS[kind]
    if not (path / "config.json").is_file():
        raise DemoMissing(
            f"{path}: the bundled demo checkpoint ({kind}) is missing; "
            "pass a checkpoint folder, or rebuild it with scripts/train_demo.py"
            + (" and scripts/convert_demo_mlx.py" if kind == "mlx-4bit" else "")
        )
    return path


def is_demo(path: str | Path) -> bool:
    """Whether `path` is one of the shipped demo checkpoint folders (any spelling of it)."""
    here = Path(__file__).resolve().parent
    return Path(path).resolve() in {(here / folder).resolve() for folder in KINDS.values()}
