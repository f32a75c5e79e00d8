"""Fine-tune the bundled demo model (transformers' Qwen3_5ForCausalLM) on a mix of its original
task families and the tool-call and JSON families of tensorfold/demo/agent.py, keeping its
tokenizer, chat template and config as they are.

    PYTHONPATH=src python scripts/finetune_demo.py --out OUT [--src DIR] [--minutes 20 | --steps N]
    PYTHONPATH=src python scripts/finetune_demo.py --eval-only DIR

Trains fp32 master weights with AdamW (linear warm-up, cosine to 10%), then writes OUT/: the
source folder's files, model.safetensors with every tensor in the source file's dtype (bf16; A_log
and the GDN norm fp32), and train_log.json with a "finetune" section appended. Each step is one
batch drawn from the mixed stream, run as two micro-batches (prompts with the tool block, about
500 tokens, apart from the short ones) so that padding stays small.

The evaluation decodes greedily through TensorFold's engine: every known answer, thinking on and
off, and held-out agent prompts (a seed training never used), read as the server reads them.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_demo import Encoded, encode, fla_status, teacher_forced  # noqa: E402

from tensorfold.demo import demo_checkpoint  # noqa: E402
from tensorfold.demo.agent import (  # noqa: E402
    TOOLS,
    AgentSample,
    agent_sample,
    as_json_object,
    generate,
)
from tensorfold.demo.data import KNOWN_ANSWERS, THINKING_RATE  # noqa: E402

EVAL_SEED = 7_000_003  # held-out agent prompts: no training run draws from it
FRESH_SEED = 1_000_003  # the fresh samples train_demo.py scores (seed 0's run)
TOOL_PROMPT = 128  # prompts longer than this (the tool block) train in their own micro-batch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, default=None, help="weights to start from (the demo's)")
    p.add_argument("--out", type=Path)
    p.add_argument("--eval-only", type=Path, default=None, help="only evaluate this folder")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--minutes", type=float, default=20.0, help="training wall-clock budget")
    p.add_argument("--steps", type=int, default=None, help="exact step count (overrides --minutes)")
    p.add_argument("--batch", type=int, default=24, help="sequences per step")
    p.add_argument("--agent-rate", type=float, default=0.4)
    p.add_argument(
        "--json-object-rate", type=float, default=0.0, help="share of agent samples: json_object"
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--examples", type=int, default=40_000, help="distinct samples, cycled")
    p.add_argument("--eval-per-family", type=int, default=50)
    p.add_argument("--eval-fresh", type=int, default=1024, help="fresh samples, teacher-forced")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args()
    if a.eval_only is None and a.out is None:
        p.error("--out is required unless --eval-only")
    a.src = a.src or demo_checkpoint("bf16")
    return a


def lr_at(progress: float, step: int, a: argparse.Namespace) -> float:
    """Linear warm-up over the first steps, then cosine to 10% of the peak at progress 1."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    return a.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def forced_leads(tok: Tokenizer, samples, enc: Encoded) -> np.ndarray:
    """Per sample, the position of a reply token a grammar forces (not learned), or -1."""
    lead = np.full(len(samples), -1, dtype=np.int64)
    for i, s in enumerate(samples):
        if isinstance(s, AgentSample) and s.forced_lead:
            before = tok.encode(s.trace_text(), add_special_tokens=False).ids
            at = int(enc.prompt_lens[i])
            assert list(enc.ids[i, at : at + len(before)]) == before, "the trace's ids merge"
            lead[i] = at + len(before)
    return lead


def micro_batches(enc: Encoded, lead: np.ndarray, idx: np.ndarray, device: str, pad_id: int):
    """(input_ids, labels, leads) per length group of rows idx: right-padded, labels -100
    outside the replies and at a forced lead; leads the (row, position) of each forced lead."""
    long = enc.prompt_lens[idx] > TOOL_PROMPT
    for rows in (idx[long], idx[~long]):
        if len(rows) == 0:
            continue
        width = int(enc.lengths[rows].max())
        ids = torch.from_numpy(enc.ids[rows, :width].astype(np.int64))
        pos = torch.arange(width)
        lengths = torch.from_numpy(enc.lengths[rows])[:, None]
        in_reply = (pos >= torch.from_numpy(enc.prompt_lens[rows])[:, None]) & (pos < lengths)
        in_reply &= pos != torch.from_numpy(lead[rows])[:, None]
        labels = torch.where(in_reply, ids, torch.full_like(ids, -100))
        ids = torch.where(pos < lengths, ids, torch.full_like(ids, pad_id))
        at = torch.from_numpy(lead[rows])
        leads = torch.stack([torch.nonzero(at >= 0)[:, 0], at[at >= 0]], 1)
        yield ids.to(device), labels.to(device), leads.to(device)


def lead_loss(logits: torch.Tensor, ids: torch.Tensor, leads: torch.Tensor, lead_ids):
    """At each forced lead, the loss of its token among the tokens the grammar allows there
    (`lead_ids`: the newlines a reply may open with, the brace): the model learns to prefer the
    brace to a newline once the grammar has ruled out its plain answer, and nothing else."""
    if len(leads) == 0:
        return logits.new_zeros(())
    rows = logits[leads[:, 0], leads[:, 1] - 1][:, lead_ids].float()
    want = (ids[leads[:, 0], leads[:, 1]][:, None] == lead_ids[None]).float().argmax(1)
    return torch.nn.functional.cross_entropy(rows, want, reduction="sum")


def train_step(model, opt, batches, lr: float, lead_ids: torch.Tensor) -> tuple[float, int]:
    """One optimizer step over the micro-batches: the mean loss over all their reply tokens."""
    for group in opt.param_groups:
        group["lr"] = lr
    batches = list(batches)
    count = sum(int((labels[:, 1:] != -100).sum()) + len(leads) for _, labels, leads in batches)
    total = 0.0
    for ids, labels, leads in batches:
        full = model(input_ids=ids, use_cache=False).logits
        logits = full[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            labels[:, 1:].reshape(-1),
            ignore_index=-100,
            reduction="sum",
        ) + lead_loss(full, ids, leads, lead_ids)
        (loss / count).backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total / count, count


def train(
    model, enc: Encoded, lead: np.ndarray, a: argparse.Namespace, pad_id: int, lead_ids
) -> dict:
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": a.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ],
        lr=a.lr,
        betas=(0.9, 0.95),
    )
    rng = np.random.default_rng(a.seed)
    order = iter(())
    budget = a.minutes * 60
    step, log, window = 0, [], []
    start = time.perf_counter()
    now = 0.0
    # With --steps the schedule runs by step; with --minutes by the clock (a shared CPU's speed
    # varies), so the run ends on time whatever the load.
    while step < a.steps if a.steps else now < budget:
        idx = next(order, None)
        if idx is None:
            perm = rng.permutation(len(enc.lengths))
            order = iter(
                [perm[i : i + a.batch] for i in range(0, len(perm) - a.batch + 1, a.batch)]
            )
            idx = next(order)
        progress = step / a.steps if a.steps else now / budget
        lr = lr_at(progress, step, a)
        loss, _ = train_step(
            model, opt, micro_batches(enc, lead, idx, a.device, pad_id), lr, lead_ids
        )
        window.append(loss)
        step += 1
        now = time.perf_counter() - start
        done = step == a.steps if a.steps else now >= budget
        if step % a.log_every == 0 or done:
            mean = sum(window) / len(window)
            window = []
            log.append({"step": step, "loss": round(mean, 4), "lr": lr, "seconds": round(now, 1)})
            print(f"step {step} loss {mean:.4f} lr {lr:.2e} {now:.0f}s", flush=True)
    seconds = time.perf_counter() - start
    return {
        "steps": step,
        "final_loss": log[-1]["loss"],
        "train_seconds": round(seconds, 1),
        "s_per_step": round(seconds / step, 2),
        "loss_log": log,
    }


def save_weights(model, src: Path, out: Path) -> None:
    """Every tensor of the source file, by name, in its dtype there, with its metadata."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    tensors = {}
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        metadata = f.metadata()
        for name in f.keys():
            dtype = f.get_slice(name).get_dtype()
            like = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}[dtype]
            tensors[name] = state[name].to("cpu", like).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata=metadata)
    (out / "model.safetensors").chmod(0o644)


def copy_source(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy2(f, out / f.name)


# -- evaluation ---------------------------------------------------------------------------------


AGENT_FAMILIES = ("tool_call", "tool_answer", "json", "json_object")


def held_out_agent(per_family: int) -> list[AgentSample]:
    """per_family samples of each agent family, from a seed no training run uses."""
    import random

    rng, out, counts = random.Random(EVAL_SEED), [], defaultdict(int)
    while min(counts[f] for f in AGENT_FAMILIES) < per_family:
        s = agent_sample(rng, rng.random() < THINKING_RATE, json_object_rate=0.25)
        if counts[s.task.family] < per_family:
            counts[s.task.family] += 1
            out.append(s)
    return out


def _answer(text: str) -> str:
    return text.rsplit("</think>", 1)[-1].strip()


def agent_ok(s: AgentSample, reply: str) -> bool:
    """The reply as the server reads it: one call of the right tool with the right arguments, the
    result, or the JSON object with the right answer."""
    from tensorfold.server.toolcalls import ToolCallStream

    answer = _answer(reply)
    if s.task.family == "tool_call":
        want = ToolCallStream(list(TOOLS)).feed(s.reply)[1][0]
        stream = ToolCallStream(list(TOOLS))
        text, calls = stream.feed(answer)
        text += stream.finish()
        return (
            not text.strip()
            and len(calls) == 1
            and calls[0].name == want.name
            and json.loads(calls[0].arguments) == json.loads(want.arguments)
        )
    if s.task.family == "tool_answer":
        return answer == s.reply
    try:
        return json.loads(answer) == json.loads(s.reply)
    except ValueError:
        return False


def json_object_grammar(tok, thinking: bool):
    """The grammar the server gives a request with `response_format: json_object`."""
    from llguidance import LLMatcher

    from tensorfold.engine.constraints import Grammar
    from tensorfold.server.structured import json_grammar

    source = LLMatcher.grammar_from_lark(json_grammar({"type": "object"}))
    return Grammar(source, tok.encode("</think>")[-1] if thinking else None)


def greedy_replies(path: Path, samples: list, threads: int) -> list[str]:
    """Each sample's greedy reply; a json_object one under the server's json_object grammar."""
    from tensorfold.engine.engine import Engine, EngineConfig
    from tensorfold.engine.request import SamplingParams
    from tensorfold.models.loader import load_model
    from tensorfold.tokenizer import Tokenizer as ChatTokenizer

    tok = ChatTokenizer(path)
    engine = Engine(
        load_model(path, dtype=torch.float32),
        tok,
        EngineConfig(parallel=16, context=1024, chunk=256, threads=threads),
    )

    def params(s) -> SamplingParams:
        grammar = None
        if getattr(s, "forced_lead", False):
            grammar = json_object_grammar(tok, s.thinking)
        return SamplingParams(max_tokens=160, temperature=0.0, grammar=grammar)

    reqs = []
    for start in range(0, len(samples), 32):  # the engine's queue holds 64
        chunk = samples[start : start + 32]
        reqs += [engine.add_request(tok.encode(s.prompt_text()), params(s)) for s in chunk]
        engine.run_until_done()
    return [
        tok.decode([t for t in r.output_ids if t not in tok.eos_ids], skip_special_tokens=False)
        for r in reqs
    ]


def evaluate(path: Path, a: argparse.Namespace) -> dict:
    from tensorfold.demo.data import Sample

    start = time.perf_counter()
    known = [Sample(t, th) for th in (False, True) for t in KNOWN_ANSWERS]
    known_json = [as_json_object(s.task, s.thinking) for s in known]
    agent = held_out_agent(a.eval_per_family)
    replies = greedy_replies(path, known + known_json + agent, a.threads or torch.get_num_threads())
    n, m = len(known), len(known_json)
    plain, as_json, replies = replies[:n], replies[n : n + m], replies[n + m :]
    known_ok = [_answer(r) == s.task.answer for s, r in zip(known, plain)]
    json_ok = [agent_ok(s, r) for s, r in zip(known_json, as_json)]
    rates: dict[str, list[bool]] = defaultdict(list)
    failures = []
    for s, r in zip(agent, replies):
        ok = agent_ok(s, r)
        rates[s.task.family].append(ok)
        rates[f"{s.task.family} {'think' if s.thinking else 'no-think'}"].append(ok)
        if not ok and len(failures) < 12:
            failures.append({"prompt": s.task.prompt, "want": s.reply, "got": r})
    from transformers import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    fresh = generate(FRESH_SEED, a.eval_fresh, known_rate=0.0)
    table: dict[str, list[bool]] = defaultdict(list)
    for s, (ok, _) in zip(fresh, teacher_forced(model, tok, fresh, "cpu")):
        table[f"{s.task.family} {'think' if s.thinking else 'no-think'}"].append(ok)
    return {
        "known_answers_ok": f"{sum(known_ok)}/{len(known_ok)}",
        "known_wrong": [
            {"prompt": s.task.prompt, "thinking": s.thinking, "got": r}
            for s, r, ok in zip(known, plain, known_ok)
            if not ok
        ],
        "known_answers_json_object_ok": f"{sum(json_ok)}/{len(json_ok)}",
        "known_json_object_wrong": [
            {"prompt": s.task.prompt, "thinking": s.thinking, "got": r}
            for s, r, ok in zip(known_json, as_json, json_ok)
            if not ok
        ][:12],
        "agent_greedy_ok": {k: f"{sum(v)}/{len(v)}" for k, v in sorted(rates.items())},
        "agent_failures": failures,
        "fresh_exact_by_family": {k: f"{sum(v)}/{len(v)}" for k, v in sorted(table.items())},
        "eval_seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    a = parse_args()
    torch.set_num_threads(a.threads)
    if a.eval_only is not None:
        print(json.dumps(evaluate(a.eval_only, a), indent=2, ensure_ascii=False))
        return
    from transformers import Qwen3_5ForCausalLM

    start = time.perf_counter()
    tok = Tokenizer.from_file(str(a.src / "tokenizer.json"))
    samples = generate(
        a.seed, a.examples, agent_rate=a.agent_rate, json_object_rate=a.json_object_rate
    )
    enc = encode(tok, samples)
    lead = forced_leads(tok, samples, enc)
    fams = defaultdict(int)
    for s in samples:
        fams[s.task.family if isinstance(s, AgentSample) else "original"] += 1
    data = {
        "examples": len(samples),
        "families": dict(fams),
        "mean_tokens": round(float(enc.lengths.mean()), 1),
        "max_tokens": int(enc.lengths.max()),
    }
    print(f"data: {data}", flush=True)
    model = Qwen3_5ForCausalLM.from_pretrained(str(a.src), dtype=torch.float32).to(a.device)
    pad_id = tok.token_to_id("<|endoftext|>")
    lead_ids = torch.tensor([tok.token_to_id(t) for t in ("{", "Ċ", "ĊĊ")], device=a.device)
    training = train(model, enc, lead, a, pad_id, lead_ids)
    copy_source(a.src, a.out)
    save_weights(model, a.src, a.out)
    import tokenizers
    import transformers

    log = json.loads((a.src / "train_log.json").read_text())
    key = next(k for k in ("finetune", *(f"finetune_{n}" for n in range(2, 99))) if k not in log)
    log[key] = {  # a run from weights already fine-tuned adds its own section
        "seed": a.seed,
        "from": "the weights of the section before" if key != "finetune" else "the base run",
        "command": "PYTHONPATH=src python scripts/finetune_demo.py " + " ".join(sys.argv[1:]),
        "config": {k: str(v) for k, v in vars(a).items()},
        "data": data,
        "environment": {
            "device": a.device,
            "threads": a.threads,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "fla": fla_status(),
        },
        "training": training,
        "sequences_seen": training["steps"] * a.batch,
    }
    (a.out / "train_log.json").write_text(json.dumps(log, indent=2, ensure_ascii=False) + "\n")
    log[key]["evaluation"] = evaluate(a.out, a)
    log[key]["script_seconds"] = round(time.perf_counter() - start, 1)
    (a.out / "train_log.json").write_text(json.dumps(log, indent=2, ensure_ascii=False) + "\n")
    ev = log[key]["evaluation"]
    print(
        f"known answers {ev['known_answers_ok']}; agent {ev['agent_greedy_ok']}; "
        f"fresh {ev['fresh_exact_by_family']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
