"""Small drivers of the engine shared by tests."""

from __future__ import annotations

import torch

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams, Watch
from tensorfold.models.loader import load_model
from tensorfold.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def make_engine(path, dtype=torch.float32, device="cpu", **config) -> Engine:
    model = load_model(path, dtype=dtype, device=device)
    tok = Tokenizer(path) if Tokenizer.exists(path) else None
    return Engine(
        model, tok, EngineConfig(**{"parallel": 4, "context": 1024, "chunk": 128, **config})
    )


def position_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), V] at every position of `ids`, from one request's prompt passes."""
    watch = Watch(keep_logits=True)
    engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0), watch=watch)
    engine.run_until_done()
    return torch.stack([watch.logits[p] for p in range(len(ids))])


def decoded_logits(engine: Engine, ids: list[int], params: SamplingParams):
    """(request, logits [n, V] of every generated position but the last), one request alone."""
    watch = Watch(keep_logits=True)
    req = engine.add_request(ids, params, watch=watch)
    engine.run_until_done()
    return req, torch.stack([watch.logits[p] for p in range(len(ids), req.lane.computed)])


def finish_prints(engine: Engine, prints: dict[str, str]) -> Watch:
    """A watch that stores the request's end-of-reply fingerprint in prints[request_id]."""

    def on_finish(req, logits) -> None:
        prints[req.request_id] = engine.fingerprint(req, logits)

    return Watch(on_finish=on_finish)


def generate(engine: Engine, ids: list[int], params: SamplingParams = GREEDY) -> list[int]:
    req = engine.add_request(ids, params)
    engine.run_until_done()
    return req.output_ids


def sample_prompt(seed: int, n: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()
