"""One stream of the bundled demo model, plain against drafted: tokens per second, acceptance
length and drafted = plain (token ids), on held-out demo tasks with thinking on and on the
bench's code and chat prompts. Each configuration is timed over the same prompts, one request
at a time, after a warm-up pass over them (compiles, CUDA graphs); the best of --rounds.
"tok/s" counts the whole request (its prompt pass included); "generation tok/s" the tokens
after the first over the time after it (the same prompts run with max_tokens=1 give that time),
as generation speed is usually reported.

    PYTHONPATH=src python3 benchmarks/demo_drafting.py [--device cuda] [--drafts mtp:4,mtp:7,ngram:4]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from tensorfold import LLM, SamplingParams
from tensorfold.demo.data import generate
from tensorfold.receipts.prompts import DECODE_PROMPTS
from tensorfold.tokenizer import Tokenizer

DEMO = Path(__file__).resolve().parents[1] / "src" / "tensorfold" / "demo" / "bf16"


def prompt_sets(tok: Tokenizer, tasks: int) -> dict[str, list[list[int]]]:
    """Demo tasks the head was not trained on (another seed), thinking on; the bench prompts."""
    samples = [dataclasses.replace(s, thinking=True) for s in generate(7, tasks)]
    sets = {"demo tasks, thinking on": [tok.encode(s.prompt_text()) for s in samples]}
    for p in DECODE_PROMPTS:
        ids = tok.chat([{"role": "user", "content": p.text}]) if p.chat else tok.encode(p.text)
        sets[f"bench {p.name}"] = [ids]
    return sets


def timed(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    if llm.model.device.type == "cuda":
        torch.cuda.synchronize()
    start, outs = time.perf_counter(), []
    for p in prompts:
        outs.append(llm.generate([{"prompt_token_ids": p}], params)[0].outputs[0].token_ids)
    if llm.model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, outs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEMO)
    p.add_argument("--device", default="cpu")
    p.add_argument("--drafts", default="mtp:4,mtp:7,ngram:4", help="drafter:K, comma-separated")
    p.add_argument("--tasks", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lone-graphs", action="store_true", help="short prompts from CUDA graphs")
    args = p.parse_args()
    tok = Tokenizer(args.checkpoint)
    sets = prompt_sets(tok, args.tasks)
    configs = [("plain", None, 4)] + [
        (d, d.split(":")[0], int(d.split(":")[1])) for d in args.drafts.split(",") if d
    ]
    print(f"{args.checkpoint.name} on {args.device}, one stream, greedy", flush=True)
    print(
        "| prompts | drafter | tokens | tok/s | speed-up | generation tok/s | speed-up "
        "| acceptance length | drafted = plain |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, prompts in sets.items():
        plain_rate, plain_gen, plain_out = 0.0, 0.0, None
        for label, draft, k in configs:
            llm = LLM(
                args.checkpoint, device=args.device, parallel=1, context=2048,
                draft=draft, draft_tokens=k, lone_graphs=args.lone_graphs,
            )  # fmt: skip
            timed(llm, prompts, args.max_tokens)  # warm-up
            llm.engine.drafting.stats = type(llm.engine.drafting.stats)()
            best, outs = min(timed(llm, prompts, args.max_tokens) for _ in range(args.rounds))
            first = min(timed(llm, prompts, 1)[0] for _ in range(args.rounds))
            n = sum(map(len, outs))
            rate, gen = n / best, (n - len(prompts)) / max(1e-9, best - first)
            if draft is None:
                plain_rate, plain_gen, plain_out = rate, gen, outs
            same = "yes" if outs == plain_out else "NO"
            accept = f"{llm.engine.drafting.stats.acceptance_length:.2f}" if draft else "1"
            print(
                f"| {name} | {label} | {n} | {rate:,.1f} | {rate / plain_rate:.2f}x | "
                f"{gen:,.1f} | {gen / plain_gen:.2f}x | {accept} | {same} |",
                flush=True,
            )
            llm.close()


if __name__ == "__main__":
    main()
