"""The model and engine flags `run` and `serve` share: one definition, one set of defaults."""

from __future__ import annotations

import argparse

from ..ops.gated_delta import FORMS
from ..runner.launch import add_flag as add_split_flag

GPU_CHUNK = 2048  # a GPU reads long prompts fastest in large passes (vLLM's default too)
CPU_CHUNK = 128  # the CPU's passes stay short so decoding lanes are not held up behind a prompt


def add_model_flags(p: argparse.ArgumentParser, context: int | None, context_help: str) -> None:
    """The checkpoint, device, dtype, lanes, context, chunk, threads, GDN form and split."""
    p.add_argument(
        "checkpoint",
        nargs="?",
        default=None,
        help="checkpoint folder (default: the bundled demo model)",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float64"])
    p.add_argument("--parallel", type=int, default=4, help="lanes served at once")
    p.add_argument("--context", type=int, default=context, help=context_help)
    p.add_argument(
        "--chunk",
        type=int,
        default=None,
        help=f"prompt rows per lane per pass (default {GPU_CHUNK} on a GPU, {CPU_CHUNK} on the CPU)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (rounded down to a power of two; default: 1 for small models, else all)",
    )
    p.add_argument(
        "--gdn-form",
        choices=FORMS,
        default="recurrence",
        help="the gated delta rule's exact form: recurrence (one token at a time; fastest "
        "decode), chunk (64-row grid chunks through fla's kernels on a GPU; faster prompts, "
        "slower decode), grid (the same chunks in one launch a layer) or rows (one launch that "
        "computes a pass's new rows only, by substitution; grid and rows on a GPU at head dims "
        "of 128, the ones their card checks cover); each keeps every invariant, and each rounds "
        "its own way on a GPU (on the CPU chunk = grid = rows)",
    )
    add_unpacked_flag(p)
    add_split_flag(p)


def add_unpacked_flag(p: argparse.ArgumentParser) -> None:
    """--unpacked-weights / --no-unpacked-weights (default: the engine's choice, None)."""
    p.add_argument(
        "--unpacked-weights",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also hold each packed weight dequantized to the model's dtype (2 bytes a weight "
        "more in bf16, 4 in float32; the same tokens): products that would dequantize a whole "
        "weight every pass (the CPU's; a GPU's prompts and many lanes) read it instead "
        "(default: on for a small model on the CPU, and on a GPU past 128 lanes when it fits)",
    )


def add_overlap_flag(p: argparse.ArgumentParser) -> None:
    """--overlap / --no-overlap (default: the engine's choice, EngineConfig.overlap None)."""
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="plan and launch each pass while the one before chooses its tokens, which are read "
        "back while it runs (the same tokens; default: on a GPU for a whole model; a drafting "
        "engine overlaps while every lane's drafts rest)",
    )


def chunk_for(chunk: int | None, device) -> int:
    """--chunk as given, else the device's default."""
    return chunk or (GPU_CHUNK if device.type == "cuda" else CPU_CHUNK)


def mixed_chunk_for(mixed: int | None) -> int | None:
    """--mixed-chunk as given; 0 or unset: no cap (a pass beside decoding lanes takes whole
    chunks). Not capped by default: while a pass with prompt rows runs eagerly (no CUDA graph),
    a cap of 256 on the 9B halved the served p99 gap between tokens at 64 streams but cost 19% of
    the output rate and tripled the p99 time to first token (docs/BENCHMARKS.md)."""
    if mixed is not None and mixed < 0:
        raise ValueError(f"--mixed-chunk {mixed}: prompt rows per pass cannot be negative")
    return mixed or None
