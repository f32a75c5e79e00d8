"""Test helpers for drafting: a scripted drafter and a random MTP head with published names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from engine_util import finish_prints, make_engine, sample_prompt
from safetensors.torch import save_file

from tensorfold.config import ModelConfig
from tensorfold.drafters.base import Drafter, LaneDrafter
from tensorfold.engine.request import SamplingParams
from tensorfold.models.dflash import read_config, tensor_shapes
from tensorfold.models.mtp import mtp_shapes


class Script(Drafter, LaneDrafter):
    """A drafter that knows each prompt's plain reply and proposes it, every token for which
    `wrong(position)` holds turned into another token."""

    def __init__(
        self, replies: dict[tuple[int, ...], list[int]], wrong=lambda p: False, on_device=False
    ) -> None:
        """`on_device`: its drafts come as a tensor, as a drafter leaves them on the device."""
        self.replies, self.wrong, self.on_device = replies, wrong, on_device

    def for_request(self, req=None):
        return self

    guesses = True  # it knows the reply: the unread token too

    def propose(self, tokens, output, k):
        prompt = tuple(tokens[: len(tokens) - len(output)])
        reply, n = self.replies[prompt], len(output)
        drafts = [(t + 1) % 300 if self.wrong(n + j) else t for j, t in enumerate(reply[n : n + k])]
        return torch.tensor(drafts, dtype=torch.long) if self.on_device and drafts else drafts


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


def drafter_config(target: ModelConfig, **over) -> dict:
    """A config.json as z-lab ships it, for `target`; `over` changes top-level or dflash fields."""
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target.hidden_size,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": target.vocab_size,
        "num_target_layers": target.num_layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
        "use_sliding_window": True,
        "dflash_config": {"block_size": 6, "mask_token_id": 7, "target_layer_ids": [1, 5]},
    }
    for k, v in over.items():
        inner = k in cfg["dflash_config"] or k in DFLASH2_FIELDS
        (cfg["dflash_config"] if inner else cfg)[k] = v
    return cfg


DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def dflash2_over(**over) -> dict:
    """`write_drafter` fields of a DFlash2 drafter as z-lab ships them (every layer sliding,
    `is_causal` false, the two convolution and two selector fields), tiny; `over` wins."""
    return {
        "architectures": ["DFlash2DraftModel"],
        "is_causal": False,
        "layer_types": ["sliding_attention", "sliding_attention"],
        "conv_kernel_size": 2,
        "conv_group_size": 16,
        "selector_rank": 8,
        "selector_top_k": 5,
        **over,
    }


def write_drafter(out, target: ModelConfig, shapes_from=None, seed=0, **over):
    """A random DFlash drafter folder for `target` (config.json + model.safetensors, published
    names); `shapes_from` writes another config's tensor shapes (a mis-bound file)."""
    out.mkdir(parents=True)
    cfg = drafter_config(target, **over)
    (out / "config.json").write_text(json.dumps(cfg))
    c = read_config(out) if shapes_from is None else shapes_from
    g = torch.Generator().manual_seed(seed)
    tensors = {
        name: (
            torch.randn(shape, generator=g) * (0.3 if len(shape) > 1 else 0.1) + (len(shape) == 1)
        ).to(torch.bfloat16)
        for name, shape in tensor_shapes(c).items()
    }
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


DRAFT_MODES = {
    "greedy": SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
    "sampled": SamplingParams(max_tokens=20, temperature=0.8, top_k=40, seed=9, ignore_eos=True),
}


def drafted_run(
    path, params: SamplingParams, parallel: int, draft, first_seed=60, lengths=(15, 31, 8, 44)
):
    """Prompts admitted a step apart (prompt cache on): ([(output ids, fingerprints)], engine)."""
    from engine_util import make_engine, sample_prompt

    eng = make_engine(path, parallel=parallel, prompt_cache_bytes=1 << 24, draft=draft)
    prompts = [sample_prompt(first_seed + i, n, 300) for i, n in enumerate(lengths)]
    return stepped_run(eng, prompts, params), eng


def stepped_run(eng, prompts, params: SamplingParams) -> list:
    """Each prompt admitted a step after the one before, then run to the end: [(output ids,
    final fingerprint)] in prompt order."""
    from engine_util import finish_prints

    prints, reqs = {}, []
    for ids in prompts:
        reqs.append(eng.add_request(ids, params, watch=finish_prints(eng, prints)))
        eng.step()
    eng.run_until_done()
    return [(r.output_ids, prints[r.request_id]) for r in reqs]


def fixed_price(monkeypatch, ratio: float = 1.4) -> None:
    """Every verify pass priced at `ratio` plain passes: the gates' decisions follow the drafts
    alone, not the clock."""
    from tensorfold.drafters.gate import PassPrices

    monkeypatch.setattr(PassPrices, "ratio", lambda self, lanes, rows: ratio)
    monkeypatch.setattr(PassPrices, "plain_measured", lambda self: True)
    monkeypatch.setattr(PassPrices, "lookup_share", lambda self, lanes: None)


THREE = [list(range(5 + i, 17 + 3 * i)) for i in range(3)]
THREE_PARAMS = [
    SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=120, temperature=0.8, seed=3, ignore_eos=True),
    SamplingParams(max_tokens=90, temperature=0.0, ignore_eos=True),
]


def _overlapped(path, draft: str, lane_cls, overlap: bool, monkeypatch):
    """Three lanes of a random (mostly wrong) drafter that reads the target's states, at a fixed
    verify price, so that the gates' decisions depend on the drafts alone: (replies, every
    proposal, the lanes' reads made inside overlapped steps, overlapped steps, all steps)."""
    from engine_util import make_engine

    fixed_price(monkeypatch)
    eng = make_engine(path, parallel=3, draft=draft, draft_tokens=4, overlap=overlap)
    proposals, seen = [], {"inside": 0, "reads": 0, "overlapped": 0}
    propose_many = eng.drafting.default.propose_many
    eng.drafting.default.propose_many = lambda asks: (
        proposals.append(propose_many(asks)) or (proposals[-1])
    )
    observe, overlapped = lane_cls.observe, eng._overlapped_step

    def read(lane, *args):
        seen["reads"] += seen["inside"]
        return observe(lane, *args)

    def step(proposed=False):
        seen["inside"], seen["overlapped"] = 1, seen["overlapped"] + 1
        try:
            return overlapped(proposed)
        finally:
            seen["inside"] = 0

    monkeypatch.setattr(lane_cls, "observe", read)
    eng._overlapped_step = step
    reqs, steps = [eng.add_request(p, s) for p, s in zip(THREE, THREE_PARAMS)], 0
    while eng.has_work():
        eng.step()
        steps += 1
    return [r.output_ids for r in reqs], proposals, seen["reads"], seen["overlapped"], steps


def assert_overlapped_reads_as_sequential(path, draft: str, lane_cls, monkeypatch) -> None:
    """With overlap, a closed gate's drafter reads the target's states of the overlapped passes
    before its retry (after their tokens are chosen on the device), so it drafts exactly what
    the sequential drafting engine's drafter drafts, the replies are plain's, and the passes in
    which a gate counts down to its retry still overlap."""
    from engine_util import make_engine

    plain = make_engine(path, parallel=3)
    seq, seq_drafts, _, _, _ = _overlapped(path, draft, lane_cls, False, monkeypatch)
    got, drafts, reads, overlapped, steps = _overlapped(path, draft, lane_cls, True, monkeypatch)
    want = [plain.add_request(p, s) for p, s in zip(THREE, THREE_PARAMS)]
    plain.run_until_done()
    assert got == seq == [r.output_ids for r in want]
    assert drafts == seq_drafts and len(drafts) >= 6
    assert reads > 0  # the drafter read overlapped passes' states
    assert overlapped >= steps * 3 // 4, (overlapped, steps)


def plain_replies(path, seed: int, lengths: tuple[int, ...], tokens: int):
    """Greedy prompts of these lengths and their plain replies (the scripted drafter's):
    (prompts, params, plain requests, {prompt: reply})."""
    prompts = [sample_prompt(seed + i, n, 300) for i, n in enumerate(lengths)]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    plain = make_engine(path, parallel=len(lengths), overlap=False)
    want = [plain.add_request(ids, params) for ids in prompts]
    plain.run_until_done()
    return prompts, params, want, {tuple(ids): r.output_ids for ids, r in zip(prompts, want)}


def engine_clock(monkeypatch) -> list[float]:
    """The engine's clock made the test's: [seconds], which only the test advances."""
    import tensorfold.engine.engine as engine_module

    now = [0.0]

    class Clock:
        @staticmethod
        def perf_counter():
            return now[0]

    monkeypatch.setattr(engine_module, "time", Clock)
    return now


def staggered_run(path, prompts, params, parallel, drafter=None, **config):
    """Requests staggered one per pass, the prompt cache on, `drafter` (a scripted one) the
    engine's if given; returns [(ids, end-of-reply fingerprint)] and the engine."""
    config.setdefault("prompt_cache_bytes", 1 << 24)
    eng = make_engine(path, parallel=parallel, draft="ngram" if drafter else None, **config)
    if drafter is not None:
        eng.drafting.default = drafter
    prints, reqs, pending = {}, [], list(prompts)
    while pending or eng.has_work():
        if pending:
            reqs.append(eng.add_request(pending.pop(0), params, watch=finish_prints(eng, prints)))
        eng.step()
    return [(r.output_ids, prints[r.request_id]) for r in reqs], eng
