"""`--tensor-parallel N`: start or join the ranks of a tensor split, and load this rank's part.

On one machine the command starts the other N-1 ranks itself (`python -m
tensorfold.runner.rank`, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set; gloo on the CPU,
NCCL on GPUs). Under torchrun (several machines: --nnodes, --node-rank, --master-addr) every
process runs the same command and joins through env://. Rank 0 goes on to serve or run; the
others follow its passes and exit when it stops.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from ..config import ModelConfig
from ..errors import SplitRefused
from ..models.loader import load_model
from ..models.split import plan_shard
from .distributed import SplitRunner, follow, init_group
from .model_runner import ModelRunner

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def make_runner(model, caches, threads: int | None, graphs: bool, context: int) -> ModelRunner:
    """The runner of a loaded model: a split's leader (its passes travel to the other ranks
    first) when the model is one rank's part, else the plain one."""
    runner = ModelRunner if model.group is None else SplitRunner
    return runner(model, caches, threads, graphs, context)


def add_flag(p) -> None:
    p.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="split the model over N ranks (exact: split = whole bitwise); on one machine the "
        "command starts them, under torchrun it joins them",
    )


def wants_split(world: int) -> bool:
    """A split: asked for (N > 1), or a launcher (torchrun) started this process as a rank."""
    if world < 1:
        raise SplitRefused(f"--tensor-parallel {world}: the number of ranks must be at least 1")
    return world > 1 or "WORLD_SIZE" in os.environ


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(
    path: str | Path, dtype: torch.dtype, device: torch.device, world: int
) -> list[subprocess.Popen]:
    """Starts ranks 1..world-1 on this machine, each following; this process becomes rank 0."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    if device.type == "cpu":  # the machine's cores shared between its ranks, as torchrun does
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
        env["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    children = []
    for rank in range(1, world):
        child_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        cmd = [sys.executable, "-m", "tensorfold.runner.rank", str(path), str(dtype), device.type]
        cmd.append(str(world))
        children.append(subprocess.Popen(cmd, env=child_env))
    os.environ.update({k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")})
    os.environ.update(RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(world))
    atexit.register(_reap, children)
    return children


def _reap(children: list[subprocess.Popen]) -> None:
    for child in children:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()


def rank_device(device: torch.device) -> torch.device:
    """Each rank of a machine on its own GPU (LOCAL_RANK); the CPU for all of them otherwise."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def load_split(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    world: int,
    progress: bool | None = None,
):
    """(model, device) on rank 0 (the model whole when no split is asked). The other ranks follow
    rank 0's passes and end their process at its stop (they never return)."""
    if not wants_split(world):
        return load_model(path, dtype=dtype, device=device, progress=progress), device
    plan_shard(ModelConfig.from_dir(path), 0, world, dtype)  # refused before any rank starts
    if "RANK" not in os.environ:
        if device.type == "cuda" and torch.cuda.device_count() < world:
            raise SplitRefused(
                f"--tensor-parallel {world}: this machine has {torch.cuda.device_count()} GPUs "
                "(one rank per GPU; across machines, start the ranks with torchrun)"
            )
        start_ranks(path, dtype, device, world)
    device = rank_device(device)
    group = init_group(world, device)
    model = load_model(path, dtype=dtype, device=device, progress=progress, group=group)
    if group.rank != 0:
        follow(model)
        _leave()
    return model, device


def _leave() -> None:
    """A following rank's end, once rank 0 has said stop: flushed, then out without the
    interpreter's teardown (destroying the gloo groups after the leader has gone sometimes
    aborted the process, and its launcher then waited on it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
