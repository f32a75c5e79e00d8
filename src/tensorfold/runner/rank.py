"""A rank that `--tensor-parallel N` started on this machine: `python -m tensorfold.runner.rank
PATH DTYPE DEVICE WORLD` loads its part of the model and follows rank 0 until it stops."""

from __future__ import annotations

import sys

import torch

from .launch import load_split


def main(argv: list[str]) -> int:
    path, dtype, device, world = argv
    dtype = getattr(torch, dtype.removeprefix("torch."))
    model, _ = load_split(path, dtype, torch.device(device), int(world))
    if model is not None:
        raise SystemExit("this rank was started as rank 0: run it through --tensor-parallel")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
