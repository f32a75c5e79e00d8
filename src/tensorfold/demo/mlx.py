"""MLX affine-quantized copies of HF Qwen3.5 checkpoints, made by mlx_lm's own convert().

The files then carry mlx_lm's real transforms: language_model.* names, conv1d as [C, K, 1],
zero-centred norms stored as 1 + w, A_log in its source dtype, packed uint32 weights with
bf16 scales/biases, and config["quantization"]. mlx_lm is imported only when converting.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

QuantPredicate = Callable[[str, Any], "bool | dict[str, Any]"]


def nested_config(flat: dict[str, Any]) -> dict[str, Any]:
    """mlx_lm refuses model_type qwen3_5_text (and qwen3_5_moe_text): wrap a flat config the way
    released ones nest."""
    text = {k: v for k, v in flat.items() if k not in ("architectures", "transformers_version")}
    moe = flat.get("model_type") == "qwen3_5_moe_text"
    return {
        "architectures": [
            "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
        ],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": flat.get("tie_word_embeddings", False),
        "eos_token_id": flat.get("eos_token_id"),
    }


def _mlx_source_dir(hf_dir: Path, scratch: Path) -> Path:
    """hf_dir itself when mlx_lm can read it, else a linked copy with a nested config."""
    config = json.loads((hf_dir / "config.json").read_text())
    if config.get("model_type") not in ("qwen3_5_text", "qwen3_5_moe_text"):
        return hf_dir
    src = scratch / "nested_src"
    src.mkdir()
    for f in hf_dir.iterdir():
        if f.name != "config.json" and f.is_file():
            (src / f.name).symlink_to(f.resolve())
    (src / "config.json").write_text(json.dumps(nested_config(config), indent=2))
    return src


def convert_to_mlx(
    hf_dir: str | Path,
    out_dir: str | Path,
    *,
    bits: int = 4,
    group_size: int = 64,
    quant_predicate: QuantPredicate | None = None,
) -> Path:
    """Quantize an HF checkpoint with mlx_lm.convert (affine, bf16 scales/biases) into out_dir,
    replacing it. quant_predicate(path, module) -> bool | dict picks per-module bits (mlx_lm's)."""
    from mlx_lm import convert

    hf, out = Path(hf_dir), Path(out_dir)
    if out.exists():
        shutil.rmtree(out)  # convert() refuses an existing destination
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        src = _mlx_source_dir(hf, Path(scratch))
        convert(
            str(src),
            mlx_path=str(out),
            quantize=True,
            q_group_size=group_size,
            q_bits=bits,
            quant_predicate=quant_predicate,
            dtype="bfloat16",
        )
    return out
