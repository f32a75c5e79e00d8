"""Whether the caches a configuration asks for fit the device, checked before they are allocated:
a KV pool of --parallel whole contexts at a long --context (the 9B's 262,144 tokens are 8 GiB a
lane in bf16) is refused by name instead of failing inside an allocation."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CacheTooLarge, UnpackedTooLarge

GiB = 1 << 30
RESERVE = 0.1  # of the device's memory, kept for the passes' working memory and CUDA graphs


def free_bytes(device: torch.device) -> int | None:
    """Memory the caches may take on `device`: the GPU's free memory less a reserve, or the
    host's MemAvailable; None where it cannot be read."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free - RESERVE * total)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(kv_bytes: int, state_bytes: int, parallel: int, context: int, device) -> None:
    """Raises CacheTooLarge when the KV pool and the recurrent states would not fit."""
    room = free_bytes(torch.device(device))
    need = kv_bytes + state_bytes
    if room is not None and need > room:
        raise CacheTooLarge(
            f"--parallel {parallel} x --context {context} needs {kv_bytes / GiB:.1f} GiB of KV "
            f"cache and {state_bytes / GiB:.1f} GiB of recurrent state, but {device} has "
            f"{max(room, 0) / GiB:.1f} GiB free for them: lower --context or --parallel"
        )


def check_unpacked_fits(need: int, device) -> None:
    """Raises UnpackedTooLarge when the weights held dequantized (`--unpacked-weights`) would not
    fit beside what is loaded, before any is made (the caches are checked after them)."""
    room = free_bytes(torch.device(device))
    if room is not None and need > room:
        raise UnpackedTooLarge(
            f"--unpacked-weights holds {need / GiB:.1f} GiB of dequantized weights, but {device} "
            f"has {max(room, 0) / GiB:.1f} GiB free: leave it off, or serve the bf16 checkpoint"
        )
