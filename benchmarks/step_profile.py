"""Where a decode step's time goes on the GPU machine: the device's time (each CUDA graph replay
between two events) against the step's wall time, and the host's parts (schedule, plan, the
runner's input copies and launch, the token rule with its one sync, the commit), at each lane
count. Prints a table last.

    PYTHONPATH=src:benchmarks python3 benchmarks/step_profile.py --models 4bit --lanes 16,64

With no overlap of host and device (--no-overlap), wall = device + host: the host share is what
an engine that plans pass N+1 while pass N runs could hide. With overlap (the engine's default on
a GPU), wall - device is the time the card waited for the host.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from clock import Clock, ReplayEvents, restored
from h200 import Run, start_decoding

from tensorfold.engine import engine as engine_module
from tensorfold.engine import overlap
from tensorfold.engine.flags import add_overlap_flag
from tensorfold.engine.request import SamplingParams
from tensorfold.runner import cuda_graph, model_runner


def profile(model, lanes: int, run: Run, steps: int) -> dict:
    eng = run.engine(model, lanes, 512, 128)
    # no lane may finish inside the timing: a smaller lane count would record its graph there
    params = SamplingParams(max_tokens=steps + 256, temperature=0.0, ignore_eos=True)
    reqs = start_decoding(eng, lanes, params)
    clock, restore = Clock(), []
    clock.wrap(eng.scheduler, "schedule", "schedule", restore)
    clock.wrap(engine_module, "plan_pass", "plan", restore)
    clock.wrap(eng.runner, "execute", "runner (inputs, launch)", restore)
    clock.wrap(model_runner, "graph_shape", "runner: graph shape", restore)
    clock.wrap(model_runner.ModelRunner, "_replay", "runner: replay + copy out", restore)
    clock.wrap(cuda_graph.PassGraph, "run", "runner: graph run", restore)
    clock.wrap(cuda_graph.PassGraph, "_load", "runner: graph inputs", restore)
    clock.wrap(model_runner, "lane_logits", "runner: lane logits", restore)
    clock.wrap(torch.cuda.CUDAGraph, "replay", "runner: replay launch", restore)
    reloads = []
    load = cuda_graph.PassGraph._load

    def counted(graph, plan):
        before = graph.members
        load(graph, plan)
        reloads.append(graph.members != before)

    cuda_graph.PassGraph._load = counted
    restore.append((cuda_graph.PassGraph, "_load", load))
    clock.wrap(eng.sampler, "choose", "token rule + sync", restore)
    clock.wrap(eng.sampler, "pick", "token rule (device)", restore)
    clock.wrap(overlap.Chosen, "read", "tokens read back (wait)", restore)
    clock.wrap(eng.output, "commit", "commit (text, stops)", restore)
    replays = ReplayEvents(restore)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    assert all(len(r.output_ids) < r.max_tokens for r in reqs)  # every lane decoded throughout
    device = replays.seconds()
    restored(restore)
    row = {"lanes": lanes, "step_ms": 1000 * wall / steps, "device_ms": 1000 * device / steps}
    row["host_ms"] = row["step_ms"] - row["device_ms"]
    row["tok_s"] = lanes * steps / wall
    row.update({k: 1000 * v / steps for k, v in clock.seconds.items()})
    row["table reloads"] = sum(reloads)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/profile")
    p.add_argument("--shape", default="9b")
    p.add_argument("--models", default="4bit")
    p.add_argument("--lanes", default="1,16,64")
    p.add_argument("--steps", type=int, default=48)
    add_overlap_flag(p)
    args = p.parse_args()
    run = Run(in_memory=True, overlap=args.overlap)
    rows = []
    for name in args.models.split(","):
        path = run.checkpoint(Path(args.out) / f"{args.shape}-{name}", args.shape, name)
        model = run.load(path)
        for lanes in (int(v) for v in args.lanes.split(",")):
            rows.append({"model": name, **profile(model, lanes, run, args.steps)})
        del model
        torch.cuda.empty_cache()
    keys = [k for k in rows[0] if k != "model"]
    print("model  " + "  ".join(keys))
    for r in rows:
        print(
            r["model"],
            "  ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys),
        )


if __name__ == "__main__":
    main()
