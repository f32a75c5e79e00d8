"""What an n-gram lane that drafts nothing costs a step, piece by piece: the demo model on one
stream, the bench chat prompt (its lookups find nothing), plain against engines configured with
the lookup drafter and parts of drafting turned off: `closed` (every gate closed: no lookup),
`bare` (no proposal and no stillness check; its plain passes still priced, as a lane that may
draft has them), plain
with the drafting engine's graph rows and KV lookahead (`plain+rows`), and `script` (a drafter
proposing the plain reply: every draft right). Rounds interleaved; each variant's request time
and step time are medians over rounds, its ratio to the first variant the median of the two's
times in the same round; tokens checked equal. A variant named twice (`plain,plain2`) gives two
engines of the same work: how far apart they land is the method's spread on that host.

With --table every engine's pass is replaced by a table of the plain reply (one-hot rows at the
positions each pass asks for): what is left is the host's time alone, the engine's bookkeeping
around a pass, at the CPU's µs rather than the model's.

    PYTHONPATH=src:tests:benchmarks python benchmarks/lookup_cost.py [--device cuda] [--rounds 40]
    PYTHONPATH=src:tests:benchmarks python benchmarks/lookup_cost.py --table --variants plain,ngram
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from demo_drafting import DEMO, paired_median, prompt_sets
from drafting_util import Script  # tests/: the scripted drafter of the drafting tests

from tensorfold import LLM, SamplingParams
from tensorfold.engine.flags import add_overlap_flag
from tensorfold.tokenizer import Tokenizer


def variant(label: str, device: str, replies: dict, overlap: bool | None) -> LLM:
    """The engine `label` names (a trailing digit: another engine of the same variant, whose
    spread against the first is the method's own)."""
    name = label.rstrip("0123456789")
    llm = LLM(
        DEMO,
        device=device,
        parallel=1,
        context=2048,
        draft=None if name.startswith("plain") else "ngram",
        overlap=overlap,
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
    if name == "bare":  # a lane's drafting state still turns pricing on (Drafting.lane)
        d.propose = lambda running: None
        d.stillness = lambda lanes: "quiet"
    if name == "plain+rows":  # the drafting engine's graphs and lookahead, no drafter
        eng.runner.graph_rows = frozenset(range(1, 6))
        eng.scheduler.lookahead = 4
    if name == "script":
        d.default = Script(replies)
    return llm


def table(engine, sequence: list[int]) -> None:
    """The engine's pass replaced by the plain reply's rows: row j of a lane chooses the token at
    its position's next, the lane's logits as the runner returns them."""
    vocab, device = engine.model.config.vocab_size, engine.model.device

    def execute(plan):
        out = {}
        for i, lane in enumerate(plan):
            if lane.logits:
                rows = torch.zeros(len(lane.logits), vocab, device=device)
                for r, j in enumerate(lane.logits):
                    rows[r, sequence[lane.start + j + 1]] = 1.0
                out[i] = rows
        return out

    engine.runner.execute = execute


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--set", default="bench chat")
    p.add_argument("--variants", default="plain,ngram,closed,bare,plain+rows")
    p.add_argument("--table", action="store_true", help="the pass a table: host time alone")
    add_overlap_flag(p)
    args = p.parse_args()
    prompt = prompt_sets(Tokenizer(DEMO), 1)[args.set][0]
    params = SamplingParams(max_tokens=256, temperature=0.0)
    ask = [{"prompt_token_ids": prompt}]
    sync = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    plain = LLM(DEMO, device=args.device, parallel=1, context=2048)
    reply = list(plain.generate(ask, params)[0].outputs[0].token_ids)
    plain.close()
    llms = {
        name: variant(name, args.device, {tuple(prompt): reply}, args.overlap)
        for name in args.variants.split(",")
    }
    whole = {name: [] for name in llms}
    per_step = {name: [] for name in llms}
    counts = {name: [0] for name in llms}
    outs = {}
    for name, llm in llms.items():
        for _ in range(3):  # warm: graphs, compiles
            llm.generate(ask, params)
        if args.table:
            table(llm.engine, prompt + reply + [0] * 16)  # rows drafted past the end too
        step = llm.engine.step

        def counted(step=step, n=counts[name]):
            n[0] += 1
            return step()

        llm.engine.step = counted
    for _ in range(args.rounds):
        for name, llm in llms.items():
            sync()
            counts[name][0] = 0
            t = time.perf_counter()
            outs[name] = llm.generate(ask, params)[0].outputs[0].token_ids
            sync()
            seconds = time.perf_counter() - t
            whole[name].append(seconds)
            per_step[name].append(seconds / max(1, counts[name][0]))
    base = next(iter(llms))
    print(f"| variant | request ms | × {base} (round by round) | step µs | steps | same tokens |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in llms:
        print(
            f"| {name} | {1e3 * statistics.median(whole[name]):.2f} | "
            f"{paired_median(whole[base], whole[name]):.3f} | "
            f"{1e6 * statistics.median(per_step[name]):.1f} | {counts[name][0]} | "
            f"{list(outs[name]) == reply} |"
        )


if __name__ == "__main__":
    main()
