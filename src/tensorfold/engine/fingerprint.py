"""system_fingerprint: what fixes a request's bytes besides the request itself. The same
fingerprint, prompt and parameters (with a seed) give the same token ids (docs/RECEIPTS.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ..ops.dispatch import ARITHMETIC_VERSION

# The files that decide tokens: weights, config, tokenizer, chat template, sampling defaults.
SUFFIXES = (".safetensors", ".json", ".jinja", ".model", ".txt")
CHUNK = 1 << 22


def device_class(device: torch.device | str) -> str:
    """cpu, or the GPU's name and compute capability (kernels pick instructions by them)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda:{torch.cuda.get_device_name(device)}:sm{major}{minor}"


def checkpoint_digest(path: str | Path) -> str:
    """sha256 over the checkpoint's token-deciding files (names, sizes and bytes, sorted)."""
    h = hashlib.sha256()
    root = Path(path)
    files = sorted(f for f in root.iterdir() if f.is_file() and f.suffix in SUFFIXES)
    for f in files:
        h.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            while block := fh.read(CHUNK):
                h.update(block)
    return h.hexdigest()


def system_fingerprint(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    digest: str | None = None,
    gdn_form: str = "recurrence",
) -> str:
    """fp_ and 16 hex digits over (checkpoint bytes, dtype, device class, arithmetic version,
    torch's version, as the CPU path's products are torch's; Triton's on a GPU)."""
    parts = {
        "checkpoint": digest or checkpoint_digest(path),
        "dtype": str(dtype).removeprefix("torch."),
        "device": device_class(device),
        "arithmetic": ARITHMETIC_VERSION,
        "torch": torch.__version__.split("+")[0],
    }
    if gdn_form != "recurrence":  # the chunk forms round differently
        # the CPU computes both chunk forms with one reference; a GPU runs each its own kernels
        parts["gdn"] = "chunk" if parts["device"] == "cpu" else gdn_form
    if parts["device"] != "cpu":  # the kernels are compiled by Triton
        import triton

        parts["triton"] = triton.__version__
    blob = json.dumps(parts, sort_keys=True).encode()
    return "fp_" + hashlib.sha256(blob).hexdigest()[:16]
