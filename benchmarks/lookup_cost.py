"""What an n-gram lane that drafts nothing costs a step, piece by piece: the demo model on one
stream, the bench chat prompt (its lookups find nothing), plain against engines configured with
the lookup drafter and parts of drafting turned off: `closed` (every gate closed: no lookup),
`bare` (no proposal, no pricing, no stillness check: only the configuration differs), and plain
with the drafting engine's graph rows and KV lookahead. Rounds interleaved, medians of whole
requests and of steps; tokens checked equal. A variant named twice (`plain,plain2`) gives two
engines of the same work: how far apart they land is the method's spread on that host.

    PYTHONPATH=src:tests:benchmarks python benchmarks/lookup_cost.py [--device cuda] [--rounds 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from demo_drafting import DEMO, prompt_sets

from tensorfold import LLM, SamplingParams
from tensorfold.tokenizer import Tokenizer


def variant(label: str, device: str) -> LLM:
    """The engine `label` names (a trailing digit: another engine of the same variant, whose
    spread against the first is the method's own)."""
    name = label.rstrip("0123456789")
    llm = LLM(
        DEMO,
        device=device,
        parallel=1,
        context=2048,
        draft=None if name.startswith("plain") else "ngram",
    )
    eng, d = llm.engine, llm.engine.drafting
    if name == "closed":
        lane = d.lane

        def closed(req, enabled, prediction):
            draft = lane(req, enabled, prediction)
            if draft is not None:
                draft.gate.skip = 1 << 30
            return draft

        d.lane = closed
    if name == "bare":
        d.priced = False
        d.propose = lambda running: None
        d.stillness = lambda lanes: "quiet"
    if name == "plain+rows":  # the drafting engine's graphs and lookahead, no drafter
        eng.runner.graph_rows = frozenset(range(1, 6))
        eng.scheduler.lookahead = 4
    return llm


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--set", default="bench chat")
    p.add_argument("--variants", default="plain,ngram,closed,bare,plain+rows")
    args = p.parse_args()
    prompt = prompt_sets(Tokenizer(DEMO), 1)[args.set][0]
    params = SamplingParams(max_tokens=256, temperature=0.0)
    sync = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    llms = {name: variant(name, args.device) for name in args.variants.split(",")}
    whole = {name: [] for name in llms}
    steps = {name: [0, 0.0] for name in llms}
    outs = {}
    for name, llm in llms.items():
        step = llm.engine.step

        def timed(step=step, acc=steps[name]):
            t = time.perf_counter()
            out = step()
            acc[0] += 1
            acc[1] += time.perf_counter() - t
            return out

        for _ in range(3):  # warm: graphs, compiles
            llm.generate([{"prompt_token_ids": prompt}], params)
        llm.engine.step = timed
    for _ in range(args.rounds):
        for name, llm in llms.items():
            sync()
            t = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
            sync()
            whole[name].append(time.perf_counter() - t)
            outs[name] = out
    base = next(iter(llms))
    print(
        f"| variant | request ms (median) | × {base} (round by round) | step µs (mean) | same tokens |"
    )
    print("| --- | --- | --- | --- | --- |")
    for name in llms:
        ratio = statistics.median(a / b for a, b in zip(whole[base], whole[name]))
        n, s = steps[name]
        print(
            f"| {name} | {1e3 * statistics.median(whole[name]):.2f} | {ratio:.3f} | "
            f"{1e6 * s / max(1, n):.0f} | {outs[name] == outs[base]} |"
        )


if __name__ == "__main__":
    main()
