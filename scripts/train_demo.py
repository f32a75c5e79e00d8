"""Train the bundled demo model: a small Qwen3.5 (transformers' Qwen3_5ForCausalLM) on the
project's generated chat tasks, from one seed.

    PYTHONPATH=src python scripts/train_demo.py --out OUT [--seed 0] [--minutes 6 | --steps N]

Writes OUT/: config.json + model.safetensors (bf16; A_log and the GDN norm in fp32 as released
Qwen3.5 files store them), tokenizer files, generation_config.json and train_log.json.
On CUDA, transformers uses fla's chunked gated-delta kernels when `fla` imports.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from tensorfold.demo.agent import generate
from tensorfold.demo.data import KNOWN_ANSWERS, Sample
from tensorfold.demo.spec import VOCAB_SIZE, ModelSpec
from tensorfold.demo.tokenizer import (
    CONTROL_TOKENS,
    control_token_ids,
    save_tokenizer,
    train_tokenizer,
)

PAD_MULTIPLE = 16  # few distinct batch shapes for the kernels
CALIBRATION_STEPS = (10, 60)  # step-time window for --minutes (after the kernels compile)


@dataclass(frozen=True)
class TrainConfig:
    out: Path
    seed: int
    minutes: float
    steps: int | None
    batch: int
    lr: float
    warmup: int
    weight_decay: float
    examples: int
    bpe_examples: int
    eval_examples: int
    log_every: int
    device: str
    agent_rate: float = 0.0  # share of tool-call and JSON samples (tensorfold/demo/agent.py)


@dataclass
class Encoded:
    """All training sequences, right-padded into one array."""

    ids: np.ndarray  # [N, max_len] int32
    lengths: np.ndarray  # [N] prompt + reply tokens
    prompt_lens: np.ndarray  # [N] tokens before the reply (no loss there)


def parse_args() -> TrainConfig:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=6.0, help="training wall-clock budget")
    p.add_argument("--steps", type=int, default=None, help="exact step count (overrides --minutes)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--examples", type=int, default=600_000, help="distinct samples, cycled")
    p.add_argument("--bpe-examples", type=int, default=100_000)
    p.add_argument("--eval-examples", type=int, default=1024)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--agent-rate",
        type=float,
        default=0.0,
        help="share of tool-call and JSON samples (0: the families of the bundled weights only)",
    )
    a = p.parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    return TrainConfig(
        a.out,
        a.seed,
        a.minutes,
        a.steps,
        a.batch,
        a.lr,
        a.warmup,
        a.weight_decay,
        a.examples,
        a.bpe_examples,
        a.eval_examples,
        a.log_every,
        device,
        a.agent_rate,
    )


def encode(tok: Tokenizer, samples: list[Sample]) -> Encoded:
    # Prompt and reply are encoded apart: the prompt ids are then exactly what the chat
    # template gives at inference (the boundary never merges: tests check it).
    prompts = tok.encode_batch([s.prompt_text() for s in samples], add_special_tokens=False)
    replies = tok.encode_batch([s.completion_text() for s in samples], add_special_tokens=False)
    seqs = [p.ids + r.ids for p, r in zip(prompts, replies)]
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    width = -(-int(lengths.max()) // PAD_MULTIPLE) * PAD_MULTIPLE
    ids = np.zeros((len(seqs), width), dtype=np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    return Encoded(ids, lengths, np.array([len(p.ids) for p in prompts], dtype=np.int64))


def batch_tensors(enc: Encoded, idx: np.ndarray, device: str, pad_id: int):
    """(input_ids, labels) for rows idx: right-padded, so no mask is needed (every layer is
    causal); labels are -100 outside the replies."""
    width = -(-int(enc.lengths[idx].max()) // PAD_MULTIPLE) * PAD_MULTIPLE
    ids = torch.from_numpy(enc.ids[idx, :width].astype(np.int64))
    pos = torch.arange(width)
    lengths = torch.from_numpy(enc.lengths[idx])[:, None]
    in_reply = (pos >= torch.from_numpy(enc.prompt_lens[idx])[:, None]) & (pos < lengths)
    labels = torch.where(in_reply, ids, torch.full_like(ids, -100))
    ids = torch.where(pos < lengths, ids, torch.full_like(ids, pad_id))
    return ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def batch_order(n: int, batch: int, rng: np.random.Generator):
    """Endless random batches: a fresh permutation per epoch."""
    while True:
        perm = rng.permutation(n)
        for start in range(0, n - batch + 1, batch):
            yield perm[start : start + batch]


def build_model(spec: ModelSpec, ids: dict[str, int], seed: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**spec.text_config(VOCAB_SIZE, ids)))


def lr_at(step: int, total: int | None, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine to 10% of the peak at `total` (unknown until calibrated)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if total is None:
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup) / max(1, total - cfg.warmup))
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=cfg.device == "cuda")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@dataclass
class Clock:
    """Training time, and with --minutes the step count that fits the budget: measured over
    CALIBRATION_STEPS, after the first steps compiled the kernels."""

    device: str
    budget: float
    total: int | None
    start: float = field(default_factory=time.perf_counter)
    mark: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def observe(self, step: int) -> None:
        if self.total is not None or step not in CALIBRATION_STEPS:
            return
        sync(self.device)
        now = self.elapsed()
        if step == CALIBRATION_STEPS[0]:
            self.mark = now
            return
        per_step = (now - self.mark) / (CALIBRATION_STEPS[1] - CALIBRATION_STEPS[0])
        self.total = step + max(1, int((self.budget - now) / per_step))
        print(f"calibrated: {self.total} steps fit {self.budget / 60:g} min", flush=True)


def train_step(model, opt, ids: torch.Tensor, labels: torch.Tensor, lr: float, cfg: TrainConfig):
    for group in opt.param_groups:
        group["lr"] = lr
    with torch.autocast(cfg.device, dtype=torch.bfloat16, enabled=cfg.device == "cuda"):
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def train(model, enc: Encoded, cfg: TrainConfig, pad_id: int) -> dict:
    model.to(cfg.device).train()
    opt = make_optimizer(model, cfg)
    batches = batch_order(len(enc.lengths), cfg.batch, np.random.default_rng(cfg.seed))
    clock = Clock(cfg.device, cfg.minutes * 60, cfg.steps)
    log, loss_sum, step = [], torch.zeros((), device=cfg.device), 0
    while clock.total is None or step < clock.total:
        lr = lr_at(step, clock.total, cfg)
        ids, labels = batch_tensors(enc, next(batches), cfg.device, pad_id)
        loss_sum += train_step(model, opt, ids, labels, lr, cfg)
        step += 1
        clock.observe(step)
        if step % cfg.log_every == 0 or step == clock.total:
            mean = loss_sum.item() / (step - (log[-1]["step"] if log else 0))
            loss_sum.zero_()
            seconds = clock.elapsed()
            log.append(
                {"step": step, "loss": round(mean, 4), "lr": lr, "seconds": round(seconds, 1)}
            )
            print(
                f"step {step}/{clock.total or '?'} loss {mean:.4f} lr {lr:.2e} {seconds:.1f}s "
                f"({1000 * seconds / step:.1f} ms/step)",
                flush=True,
            )
    sync(cfg.device)
    seconds = clock.elapsed()
    return {
        "steps": step,
        "final_loss": log[-1]["loss"],
        "train_seconds": round(seconds, 1),
        "ms_per_step": round(1000 * seconds / step, 2),
        "loss_log": log,
    }


@torch.no_grad()
def cast_for_saving(model: torch.nn.Module) -> None:
    """bf16, except A_log and the GDN gated norm, which released Qwen3.5 files keep in fp32."""
    keep = {
        n: p.detach().float().clone()
        for n, p in model.named_parameters()
        if n.endswith(("linear_attn.A_log", "linear_attn.norm.weight"))
    }
    model.to(torch.bfloat16)
    for name, p in model.named_parameters():
        if name in keep:
            p.data = keep[name].to(p.device)


def save_checkpoint(model, tok: Tokenizer, out: Path) -> None:
    ids = control_token_ids(tok)
    cast_for_saving(model)
    model.save_pretrained(out)
    save_tokenizer(tok, out)
    gen = {
        "bos_token_id": None,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": False,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


@torch.no_grad()
def teacher_forced(
    model, tok: Tokenizer, samples: list[Sample], device: str
) -> list[tuple[bool, float]]:
    """(every reply token is the argmax, smallest top-1 minus top-2 logit) per sample: a reply
    is exactly the greedy output iff every token of it is the argmax after its prefix."""
    enc, out = encode(tok, samples), []
    for start in range(0, len(samples), 256):
        idx = np.arange(start, min(start + 256, len(samples)))
        ids, labels = batch_tensors(enc, idx, device, 0)
        logits = model(input_ids=ids, use_cache=False).logits.float()[:, :-1]
        target, top2 = labels[:, 1:], logits.topk(2, dim=-1)
        scored = target != -100
        hit = (top2.indices[..., 0] == target) | ~scored
        gold = logits.gather(-1, target.clamp(min=0)[..., None])[..., 0]
        first_is_gold = top2.indices[..., 0] == target
        rival = torch.where(first_is_gold, top2.values[..., 1], top2.values[..., 0])
        margin = torch.where(scored, gold - rival, torch.full_like(gold, float("inf")))
        out += [(bool(h), float(m)) for h, m in zip(hit.all(-1).cpu(), margin.min(-1).values.cpu())]
    return out


def accuracy_by_family(model, tok: Tokenizer, cfg: TrainConfig) -> dict:
    fresh = generate(
        cfg.seed + 1_000_003, cfg.eval_examples, known_rate=0.0, agent_rate=cfg.agent_rate
    )
    scores = teacher_forced(model, tok, fresh, cfg.device)
    table: dict[str, list[bool]] = defaultdict(list)
    for s, (ok, _) in zip(fresh, scores):
        table[f"{s.task.family} {'think' if s.thinking else 'no-think'}"].append(ok)
    return {k: f"{sum(v)}/{len(v)}" for k, v in sorted(table.items())}


@torch.no_grad()
def known_answers(model, out: Path, cfg: TrainConfig) -> list[dict]:
    """Greedy replies to every KNOWN_ANSWERS prompt through transformers' tokenizer, chat
    template and generate(), thinking on and off."""
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    eos = [hf_tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    results = []
    for task in KNOWN_ANSWERS:
        for thinking in (True, False):
            messages = [{"role": "user", "content": task.prompt}]
            text = hf_tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
            )
            ids = hf_tok.encode(text, add_special_tokens=False)
            prompt = torch.tensor([ids], device=cfg.device)
            reply = model.generate(
                prompt, max_new_tokens=128, do_sample=False, eos_token_id=eos, pad_token_id=eos[1]
            )[0, prompt.shape[1] :].tolist()
            got = hf_tok.decode(reply, skip_special_tokens=False)
            expected = Sample(task, thinking).completion_text()
            answer = got.split("</think>\n\n")[-1].removesuffix("<|im_end|>")
            results.append(
                {
                    "prompt": task.prompt,
                    "thinking": thinking,
                    "answer": task.answer,
                    "got": got,
                    "answer_ok": answer == task.answer,
                    "exact": got == expected,
                    "template_matches": text == Sample(task, thinking).prompt_text(),
                }
            )
    return results


def evaluate(out: Path, tok: Tokenizer, cfg: TrainConfig) -> dict:
    """Reload the saved files (bf16 throughout) and score them."""
    from transformers import Qwen3_5ForCausalLM

    start = time.perf_counter()
    model = Qwen3_5ForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16).to(cfg.device).eval()
    known = [Sample(t, th) for t in KNOWN_ANSWERS for th in (True, False)]
    margins = [m for _, m in teacher_forced(model, tok, known, cfg.device)]
    results = known_answers(model, out, cfg)
    sync(cfg.device)
    return {
        "known_answers_ok": f"{sum(r['answer_ok'] for r in results)}/{len(results)}",
        "known_replies_exact": f"{sum(r['exact'] for r in results)}/{len(results)}",
        "known_min_margin": round(min(margins), 3),
        "fresh_exact_by_family": accuracy_by_family(model, tok, cfg),
        "known_answers": results,
        "eval_seconds": round(time.perf_counter() - start, 1),
    }


def fla_status() -> str:
    """What transformers will find: it uses fla's kernels only if this import works."""
    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception as exc:  # noqa: BLE001 (transformers falls back on any import failure too)
        return f"not used ({type(exc).__name__}: {exc})"[:160]
    return f"fla {fla.__version__}"


def environment(cfg: TrainConfig) -> dict:
    import tokenizers
    import transformers

    env = {
        "device": cfg.device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "fla": fla_status(),
    }
    if cfg.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    return env


def prepare(cfg: TrainConfig) -> tuple[Tokenizer, Encoded, dict]:
    start = time.perf_counter()
    samples = generate(cfg.seed, cfg.examples, agent_rate=cfg.agent_rate)
    texts = [s.prompt_text() + s.completion_text() for s in samples[: cfg.bpe_examples]]
    tok = train_tokenizer(texts, VOCAB_SIZE - len(CONTROL_TOKENS))
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    enc = encode(tok, samples)
    reply = enc.lengths - enc.prompt_lens
    stats = {
        "examples": len(samples),
        "vocab": tok.get_vocab_size(),
        "mean_tokens": round(float(enc.lengths.mean()), 1),
        "max_tokens": int(enc.lengths.max()),
        "tokens_per_step": round(float(enc.lengths.mean()) * cfg.batch),
        "mean_reply_tokens": round(float(reply.mean()), 1),
        "prepare_seconds": round(time.perf_counter() - start, 1),
    }
    print(f"data: {stats}", flush=True)
    return tok, enc, stats


def write_log(cfg: TrainConfig, record: dict) -> None:
    (cfg.out / "train_log.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    cfg = parse_args()
    start = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    tok, enc, data_stats = prepare(cfg)
    ids = control_token_ids(tok)
    model = build_model(ModelSpec(), ids, cfg.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters; {environment(cfg)}", flush=True)
    record = {
        "seed": cfg.seed,
        "config": {k: str(v) for k, v in asdict(cfg).items()},
        "parameters": n_params,
        "data": data_stats,
        "environment": environment(cfg),
    }
    record["training"] = train(model, enc, cfg, ids["<|endoftext|>"])
    record["sequences_seen"] = record["training"]["steps"] * cfg.batch
    record["reproduce"] = (
        f"--seed {cfg.seed} --steps {record['training']['steps']} --batch {cfg.batch} "
        f"--lr {cfg.lr} --warmup {cfg.warmup} --weight-decay {cfg.weight_decay} "
        f"--examples {cfg.examples} --bpe-examples {cfg.bpe_examples}"
    )
    save_checkpoint(model, tok, cfg.out)
    write_log(cfg, record)
    record["evaluation"] = evaluate(cfg.out, tok, cfg)
    record["script_seconds"] = round(time.perf_counter() - start, 1)
    write_log(cfg, record)
    ev = record["evaluation"]
    print(
        f"known answers {ev['known_answers_ok']} (exact replies {ev['known_replies_exact']}, "
        f"min margin {ev['known_min_margin']}); fresh: {ev['fresh_exact_by_family']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
