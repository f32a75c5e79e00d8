"""Test helpers for drafting: a scripted drafter and a random MTP head with published names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from tensorfold.config import ModelConfig
from tensorfold.models.mtp import mtp_shapes


class Script:
    """A drafter that knows each prompt's plain reply and proposes it, every token for which
    `wrong(position)` holds turned into another token."""

    def __init__(self, replies: dict[tuple[int, ...], list[int]], wrong=lambda p: False) -> None:
        self.replies, self.wrong = replies, wrong

    def for_request(self, req=None):
        return self

    def propose(self, tokens, output, k):
        prompt = tuple(tokens[: len(tokens) - len(output)])
        reply, n = self.replies[prompt], len(output)
        return [(t + 1) % 300 if self.wrong(n + j) else t for j, t in enumerate(reply[n : n + k])]


def add_mtp_head(path: Path, seed: int = 0, device: str = "cpu") -> Path:
    """Writes a random MTP head (bf16, published names and shapes) into `path` as its own file,
    named in the index when there is one."""
    shapes = mtp_shapes(ModelConfig.from_dir(path))
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {
        "mtp." + name: (torch.randn(shape, generator=g, device=device) * 0.02)
        .to(torch.bfloat16)
        .cpu()
        for name, shape in shapes.items()
    }
    save_file(tensors, path / "model-mtp.safetensors", metadata={"format": "pt"})
    index = path / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"].update({k: "model-mtp.safetensors" for k in tensors})
        index.write_text(json.dumps(data, indent=2) + "\n")
    return path


def copy_with_head(src: Path, out: Path, seed: int = 0) -> Path:
    shutil.copytree(src, out)
    return add_mtp_head(out, seed)
