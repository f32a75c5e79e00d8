"""`bench prefill`: cold prompt processing on exact token arrays, wall-clock medians.

The arrays are one public-domain paragraph repeated and tokenized once by the server's own
tokenizer. Measurement k sends the N ids starting at offset k, so no two measured prompts share
their first tokens and none can resume from another in a prompt cache (a server's cache stays
on: the receipt measures cold prompts against it as configured). Between two measurements a short
request whose first token differs from the arrays' runs too, for servers that keep only the last
prompt. Every record must show cached_tokens 0 and prompt_tokens N.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..util import token_sha
from .client import Endpoint, Reply, Tokens
from .plot import PlotRequest, plot_one, prefill_panel
from .prompts import PARAGRAPH, Prompt
from .report import median, progress, short, table, write_json

SHORT_LEN = 8


@dataclass(frozen=True)
class PrefillConfig:
    endpoint: Endpoint
    model: str
    sizes: tuple[int, ...]
    rounds: int = 3
    warmup: int = 2048
    as_text: bool = False  # send the arrays decoded as text (servers that take no ids)


def build_arrays(tokens: Tokens, sizes: tuple[int, ...], offsets: int) -> list[int]:
    """Enough ids for the largest size at every offset: the paragraph repeated, tokenized in one
    call. Offsets must stay below the paragraph's length in tokens, or two would coincide."""
    per = max(1, len(tokens.encode(PARAGRAPH)))
    if offsets >= per:
        raise ValueError(
            f"{offsets} measurements need distinct starts, but the paragraph is "
            f"{per} tokens long: use fewer rounds or sizes"
        )
    ids = tokens.encode(PARAGRAPH * ((max(sizes) + offsets) // per + 2))
    if len(ids) < max(sizes) + offsets:
        raise RuntimeError(f"the tokenizer gave {len(ids)} ids, fewer than {max(sizes) + offsets}")
    return ids


def context_prompt(tokens, n: int, as_text: bool = False) -> Prompt:
    """A completion prompt of exactly `n` tokens of the paragraph repeated (`tokens`: a
    receipts.client.Tokens), as ids, or as their text for servers that take no ids (a text
    prompt may tokenize to a slightly different length there)."""
    ids = build_arrays(tokens, (n,), 1)[:n]
    if as_text:
        return Prompt(f"context {n}", tokens.decode(ids), chat=False)
    return Prompt(f"context {n}", "", chat=False, ids=tuple(ids))


def short_prompt(ids: list[int], i: int) -> list[int]:
    """The i-th separator: its first token differs from the arrays' first token and the last
    separator's, so it shares no prefix with a measured prompt or with its predecessor."""
    firsts = [t for t in dict.fromkeys(ids[:4096]) if t != ids[0]]
    return [firsts[i % len(firsts)], *ids[1:SHORT_LEN]]


def _body(cfg: PrefillConfig, prompt: list[int] | str) -> dict:
    return {
        "model": cfg.model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0,
        "ignore_eos": True,
    }


def check_record(reply: Reply, size: int) -> dict:
    """The record of one measurement, with what is wrong with it (an empty list: nothing)."""
    usage = reply.body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached, prompt_tokens = details.get("cached_tokens"), usage.get("prompt_tokens")
    problems = []
    if reply.status != 200:
        problems.append(f"HTTP {reply.status}: {str(reply.body)[:200]}")
    if prompt_tokens != size:
        problems.append(f"prompt_tokens {prompt_tokens}, not {size}")
    if cached not in (0, None):
        problems.append(f"cached_tokens {cached}, not 0")
    return {
        "size": size,
        "seconds": reply.seconds,
        "tok_s": size / reply.seconds,
        "status": reply.status,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "problems": problems,
    }


class PrefillRun:
    def __init__(self, cfg: PrefillConfig, tokens: Tokens) -> None:
        self.cfg, self.tokens = cfg, tokens
        self.ids = build_arrays(tokens, cfg.sizes, 1 + cfg.rounds * len(cfg.sizes))
        self.measured = 0  # the next measurement's offset

    def measure(self, size: int) -> dict:
        offset = self.measured
        ids = self.ids[offset : offset + size]
        prompt = self.tokens.decode(ids) if self.cfg.as_text else ids
        record = check_record(
            self.cfg.endpoint.post("/v1/completions", _body(self.cfg, prompt)), size
        )
        self.cfg.endpoint.post("/v1/completions", _body(self.cfg, short_prompt(self.ids, offset)))
        self.measured += 1
        return {**record, "offset": offset, "sha": token_sha(ids)}

    def run(self) -> dict:
        warm = self.measure(min(self.cfg.warmup, max(self.cfg.sizes)))
        records = []
        with progress(self.cfg.rounds * len(self.cfg.sizes), "bench prefill") as bar:
            for r in range(self.cfg.rounds):
                for n in self.cfg.sizes:
                    records.append({"round": r, **self.measure(n)})
                    bar.update()
        # a record's array is ids[offset:offset + size]; its sha is token_sha of that
        return {
            "tool": "bench prefill",
            "url": self.cfg.endpoint.url,
            "model": self.cfg.model,
            "tokenizer": self.tokens.source,
            "as_text": self.cfg.as_text,
            "warmup": warm,
            "records": records,
            "ids": self.ids,
        }


def prefill_table(result: dict) -> str:
    rows = []
    for size in dict.fromkeys(r["size"] for r in result["records"]):
        group = [r for r in result["records"] if r["size"] == size]
        secs = median([r["seconds"] for r in group])
        rows.append(
            [
                size,
                f"{size / secs:,.1f} ({secs:.2f})",
                ", ".join(f"{r['seconds']:.3f}" for r in group),
                ", ".join(str(r["cached_tokens"]) for r in group),
                "ok" if not any(r["problems"] for r in group) else "FAIL",
                ", ".join(short(r["sha"]) for r in group),
            ]
        )
    return table(
        [
            "tokens",
            "median tok/s (s)",
            "seconds by round",
            "cached",
            "checks",
            "array sha by round",
        ],
        rows,
    )


def prefill_command(
    cfg: PrefillConfig, tokens: Tokens, output: str | None, plot: PlotRequest | None = None
) -> int:
    result = PrefillRun(cfg, tokens).run()
    print(prefill_table(result))
    bad = [r for r in [result["warmup"], *result["records"]] if r["problems"]]
    for r in bad:
        print(f"check failed at {r['size']} tokens: {'; '.join(r['problems'])}")
    if all(r["cached_tokens"] is None for r in result["records"]):
        print("note: the server reports no cached_tokens; only prompt_tokens was checked")
    write_json(output, result)
    if plot is not None:
        plot_one(prefill_panel(result, plot), plot, f"bench prefill: {cfg.model}")
    return 1 if bad else 0
