"""One stream of the bundled demo model, plain against drafted: tokens per second, acceptance
length and drafted = plain (token ids), on held-out demo tasks with thinking on and on the
bench's code and chat prompts. Each configuration is timed over the same prompts, one request
at a time, after a warm-up pass over them (compiles, CUDA graphs); the best of --rounds (more
for a set of short replies, --min-tokens), the configurations' rounds interleaved.
"tok/s" counts the whole request (its prompt pass included); "generation tok/s" the tokens
after the first over the time after it (the same prompts run with max_tokens=1 give that time),
as generation speed is usually reported. "round by round" is the median over rounds of plain's
time over the drafter's in the same round: on a host whose speed drifts it is the steadier
figure (two best rounds may come from different moments). "step µs" is an engine step's mean wall time in the timed
rounds and "waits µs" the part of it spent waiting for the card's tokens (an overlapped step's
read, a plain step's choice): a step that hardly waits is bound by the host's work, not the card.
Below each set, every configuration's timed steps by kind (overlapped, sequential plain, verify)
and what each kind took beyond as many of plain's mean steps: where a drafted reply loses.

    PYTHONPATH=src python3 benchmarks/demo_drafting.py [--device cuda] [--drafts mtp:4,mtp:7,ngram:4]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from tensorfold import LLM, SamplingParams
from tensorfold.demo.data import generate
from tensorfold.engine import overlap, sampler
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


class StepClock:
    """An engine's steps and the time they waited for the card's tokens (the reads that sync),
    and its steps by kind: a verify pass's, an overlapped one (its tokens left on the device
    to be read by the next step) or a sequential plain one (read before the step ends)."""

    KINDS = ("overlapped", "sequential", "verify")

    def __init__(self) -> None:
        self.steps, self.seconds, self.waits = 0, 0.0, 0.0
        self.kinds = {kind: [0, 0.0] for kind in self.KINDS}  # steps, seconds
        self.on = False

    def watch(self, engine) -> None:
        step = engine.step

        def timed():
            verifies = engine.drafting.stats.verifies
            t = time.perf_counter()
            try:
                return step()
            finally:
                if self.on:
                    seconds = time.perf_counter() - t
                    self.steps += 1
                    self.seconds += seconds
                    if engine.drafting.stats.verifies > verifies:
                        kind = "verify"
                    else:
                        kind = "overlapped" if engine._chosen is not None else "sequential"
                    self.kinds[kind][0] += 1
                    self.kinds[kind][1] += seconds

        engine.step = timed

    def by_kind(self, plain: "StepClock") -> str:
        """Steps of each kind (µs each on average), and what each kind took beyond as many of
        `plain`'s steps (its mean step): where a drafted reply's time goes against plain's."""
        mean = plain.seconds / max(1, plain.steps)
        parts = [
            f"{kind} {n} x {1e6 * s / n:.0f} ({1e3 * (s - n * mean):+.2f} ms)"
            for kind, (n, s) in self.kinds.items()
            if n
        ]
        return "steps by kind, µs (beyond plain's mean step): " + ", ".join(parts)


def clock_waits(current: list[StepClock | None]) -> None:
    """The syncs that wait for chosen tokens, timed into the StepClock in `current[0]`."""
    for owner, name in (
        (overlap.Chosen, "read"),
        (sampler.Sampler, "choose"),
        (sampler.Sampler, "greedy_picks"),
    ):
        fn = getattr(owner, name)

        def timed(self, *args, _fn=fn, **kwargs):
            t = time.perf_counter()
            try:
                return _fn(self, *args, **kwargs)
            finally:
                if current[0] is not None and current[0].on:
                    current[0].waits += time.perf_counter() - t

        setattr(owner, name, timed)


def prices_line(label: str, llm: LLM, k: int) -> str:
    """The engine's measured pass times at one lane (µs, the window kept) and the price of a
    verify pass of 1 + k rows that its gates read."""
    prices = llm.engine.drafting.prices
    windows = {rows: prices.seconds.get((1, rows), ()) for rows in (1, k + 1)}
    shown = "; ".join(
        f"{rows} rows: " + " ".join(f"{1e6 * t:.0f}" for t in w) for rows, w in windows.items()
    )
    ratio = prices.ratio(1, k + 1)
    return f"{label}: price {ratio if ratio is None else f'{ratio:.2f}'} ({shown})"


def paired_median(plain: list[float], drafted: list[float]) -> float:
    """The median over rounds of plain's seconds over the drafter's in the same round (the
    configurations' rounds run back to back): a host whose speed drifts between rounds moves
    both alike, where the best round of each may come from different moments."""
    return statistics.median(p / d for p, d in zip(plain, drafted))


def rounds_for(replies: list[list[int]], args) -> int:
    """--rounds, more for a set of short replies (the bench chat's ~34 tokens, ~13 ms a round):
    its best round then stands on as many tokens as about --min-tokens, not on one lucky
    instant of the host."""
    tokens = max(1, sum(map(len, replies)))
    return args.rounds * min(16, max(1, -(-args.min_tokens // tokens)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEMO)
    p.add_argument("--device", default="cpu")
    p.add_argument("--drafts", default="mtp:4,mtp:7,ngram:4", help="drafter:K, comma-separated")
    p.add_argument("--tasks", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--min-tokens", type=int, default=1024,
        help="a set whose replies are shorter runs its rounds as many times more (at most 16)",
    )  # fmt: skip
    p.add_argument(
        "--no-lone-graphs", dest="lone_graphs", action="store_false",
        help="short prompts read eagerly, not from CUDA graphs (the engine's default)",
    )  # fmt: skip
    args = p.parse_args()
    tok = Tokenizer(args.checkpoint)
    sets = prompt_sets(tok, args.tasks)
    current: list[StepClock | None] = [None]
    clock_waits(current)
    configs = [("plain", None, 4)] + [
        (d, d.split(":")[0], int(d.split(":")[1])) for d in args.drafts.split(",") if d
    ]
    print(f"{args.checkpoint.name} on {args.device}, one stream, greedy", flush=True)
    print(
        "| prompts | drafter | tokens | tok/s | speed-up | generation tok/s | speed-up "
        "| round by round (median) | acceptance length | step µs | waits µs | drafted = plain |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
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
        clocks = {label: StepClock() for label in llms}
        warm = {}
        for label, llm in llms.items():
            clocks[label].watch(llm.engine)
            warm[label] = timed(llm, prompts, args.max_tokens)[1]  # warm-up
            llm.engine.drafting.stats = type(llm.engine.drafting.stats)()
        whole = {label: [] for label in llms}
        first = {label: [] for label in llms}
        outs = {}
        # the configurations' rounds interleaved: a drift of the clock reaches every one
        for _ in range(rounds_for(warm[configs[0][0]], args)):
            for label, llm in llms.items():
                current[0], clocks[label].on = clocks[label], True
                seconds, outs[label] = timed(llm, prompts, args.max_tokens)
                clocks[label].on = False
                whole[label].append(seconds)
                first[label].append(timed(llm, prompts, 1)[0])
        plain = configs[0][0]
        rates = {}
        for label, llm in llms.items():
            n = sum(map(len, outs[label]))
            best = min(whole[label])
            rates[label] = (n / best, (n - len(prompts)) / max(1e-9, best - min(first[label])))
            rate, gen = rates[label]
            paired = paired_median(whole[plain], whole[label])
            same = "yes" if outs[label] == outs[plain] else "NO"
            stats = llm.engine.drafting.stats
            accept = f"{stats.acceptance_length:.2f}" if label != plain else "1"
            c = clocks[label]
            step, waits = (1e6 * x / max(1, c.steps) for x in (c.seconds, c.waits))
            print(
                f"| {name} | {label} | {n} | {rate:,.1f} | {rate / rates[plain][0]:.2f}x | "
                f"{gen:,.1f} | {gen / rates[plain][1]:.2f}x | {paired:.2f}x | {accept} | "
                f"{step:.0f} | {waits:.0f} "
                f"| {same} |",
                flush=True,
            )
        for label in llms:  # the timed rounds together
            print(f"  {name}, {label}: {clocks[label].by_kind(clocks[plain])}", flush=True)
        for (label, _, k), llm in zip(configs[1:], list(llms.values())[1:]):
            print(prices_line(f"  {name}, {label}", llm, k), flush=True)
        for llm in llms.values():
            llm.close()


if __name__ == "__main__":
    main()
