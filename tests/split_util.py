"""Drivers of a tensor split in tests: every rank a spawned process over gloo on loopback; rank 0
runs a scenario on its engine and hands the result back; the others follow its passes."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback

import torch
from engine_util import decoded_logits, finish_prints, position_logits, sample_prompt

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.models.loader import load_model
from tensorfold.runner.distributed import follow, init_group

ENGINE = {"parallel": 4, "context": 512, "chunk": 128}
TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scenario_results(make_engine, vocab: int) -> dict:
    """Token ids, logits bytes and fingerprints of the exactness scenarios; `make_engine(**cfg)`
    builds an engine over the (whole or split) model."""
    out = {}
    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    prompt = sample_prompt(1, 150, vocab)
    for chunk in (128, 37):  # chunked prompts: the seams differ, the bits may not
        engine = make_engine(chunk=chunk)
        out[f"prompt_logits_{chunk}"] = position_logits(engine, prompt[:80]).numpy().tobytes()
        req, logits = decoded_logits(engine, prompt, greedy)
        out[f"decode_{chunk}"] = (req.output_ids, logits.numpy().tobytes())
    engine = make_engine(chunk=128)
    prints: dict[str, str] = {}
    lanes = [sample_prompt(10 + i, 20 + 9 * i, vocab) for i in range(4)]
    reqs = [engine.add_request(p, greedy, watch=finish_prints(engine, prints)) for p in lanes]
    engine.run_until_done()  # four lanes sharing passes
    out["lanes"] = ([r.output_ids for r in reqs], [prints[r.request_id] for r in reqs])
    sampled = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    out["sampled"] = [engine.add_request(p, sampled) for p in lanes[:2]]
    engine.run_until_done()
    out["sampled"] = [r.output_ids for r in out["sampled"]]
    cached = make_engine(chunk=128, prompt_cache_bytes=64 << 20)
    first = cached.add_request(prompt[:60], greedy, watch=finish_prints(cached, prints))
    cached.run_until_done()
    again = cached.add_request(prompt[:60] + first.output_ids + prompt[60:90], greedy)
    cached.run_until_done()  # resumes from the first reply's end
    out["resumed"] = (
        first.output_ids,
        again.output_ids,
        again.cached_tokens,
        prints[first.request_id],
    )
    return out


def whole_results(path, dtype=torch.float32, **engine) -> dict:
    """The exactness scenarios on the whole model (`engine`: settings over ENGINE's)."""
    model = load_model(path, dtype=dtype)
    return scenario_results(
        lambda **cfg: Engine(model, None, EngineConfig(**{**ENGINE, **engine, **cfg})),
        model.config.vocab_size,
    )


def _rank(rank: int, world: int, port: int, path: str, dtype, scenario: str, queue) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    try:
        group = init_group(world, torch.device("cpu"))
        model = load_model(path, dtype=dtype, group=group)
        if rank != 0:
            follow(model)
            return
        engines = []

        def make(**cfg):
            engines.append(Engine(model, None, EngineConfig(**{**ENGINE, **cfg})))
            return engines[-1]

        result = SCENARIOS[scenario](make, model)
        engines[-1].close()
        queue.put(("ok", result))
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails by name
        # a follower's own failure first: rank 0 then sees only a lost peer
        queue.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _wait(queue, procs) -> tuple[str, object]:
    """Rank 0's answer; an error as soon as every rank has ended without one (no hang)."""
    import queue as queues
    import time

    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=1.0)
        except queues.Empty:
            if not any(p.is_alive() for p in procs):
                return "error", f"every rank ended without a result: {[p.exitcode for p in procs]}"
    return "error", f"no result in {TIMEOUT_S}s"


SCENARIOS = {
    "exactness": lambda make, model: scenario_results(make, model.config.vocab_size),
    "exactness-chunk-form": lambda make, model: scenario_results(
        lambda **cfg: make(gdn_form="chunk", **cfg), model.config.vocab_size
    ),
}


def split_results(path, world: int, scenario: str = "exactness", dtype=torch.float32):
    """Rank 0's result of `scenario` on a `world`-rank split of the checkpoint at `path`."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, str(path), dtype, scenario, queue))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        status, result = _wait(queue, procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if status != "ok":
        raise AssertionError(result)
    return result
