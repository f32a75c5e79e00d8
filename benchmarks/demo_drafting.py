"""One stream of the bundled demo model, plain against drafted: tokens per second, acceptance
length and drafted = plain (token ids), on held-out demo tasks with thinking on and on the
bench's code and chat prompts. Each configuration is timed over the same prompts, one request
at a time, after a warm-up pass over them (compiles, CUDA graphs); the best of --rounds, the
configurations' rounds interleaved.
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
    p.add_argument(
        "--no-lone-graphs", dest="lone_graphs", action="store_false",
        help="short prompts read eagerly, not from CUDA graphs (the engine's default)",
    )  # fmt: skip
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
        llms = {
            label: LLM(
                args.checkpoint,
                device=args.device,
                parallel=1,
                context=2048,
                draft=draft,
                draft_tokens=k,
                lone_graphs=args.lone_graphs,
            )  # fmt: skip
            for label, draft, k in configs
        }
        for llm in llms.values():
            timed(llm, prompts, args.max_tokens)  # warm-up
            llm.engine.drafting.stats = type(llm.engine.drafting.stats)()
        whole = {label: [] for label in llms}
        first = {label: [] for label in llms}
        outs = {}
        for _ in range(args.rounds):  # interleaved: a drift of the clock reaches every config
            for label, llm in llms.items():
                seconds, outs[label] = timed(llm, prompts, args.max_tokens)
                whole[label].append(seconds)
                first[label].append(timed(llm, prompts, 1)[0])
        plain = configs[0][0]
        rates = {}
        for label, llm in llms.items():
            n = sum(map(len, outs[label]))
            best = min(whole[label])
            rates[label] = (n / best, (n - len(prompts)) / max(1e-9, best - min(first[label])))
            rate, gen = rates[label]
            same = "yes" if outs[label] == outs[plain] else "NO"
            stats = llm.engine.drafting.stats
            accept = f"{stats.acceptance_length:.2f}" if label != plain else "1"
            print(
                f"| {name} | {label} | {n} | {rate:,.1f} | {rate / rates[plain][0]:.2f}x | "
                f"{gen:,.1f} | {gen / rates[plain][1]:.2f}x | {accept} | {same} |",
                flush=True,
            )
        for llm in llms.values():
            llm.close()


if __name__ == "__main__":
    main()
