"""Drafters: where proposed tokens come from. A drafter only guesses; the target decides every
token (engine/drafting.py), so a drafter changes speed, never output.

- `ngram`: prompt lookup over the request's own tokens (the prompt and the reply so far): the
  longest recent n-gram that ends the sequence and occurred before proposes what followed it.
- `PredictionDrafter`: OpenAI Predicted Outputs; the request's predicted text, aligned to the
  reply by the same lookup.
- `mtp`: the checkpoint's own MTP head (drafters/mtp.py).
- a drafter folder: a z-lab DFlash block drafter, v1 or DFlash2 (drafters/dflash.py); other block
  drafters (DSpark, Domino) are refused by name (NotStockDrafter).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import DraftForAnotherTarget, NotStockDrafter  # noqa: F401 (re-exported)
from .base import Drafter, LaneDrafter


class NgramIndex:
    """For every n-gram size, the latest position that followed each n-gram of a growing
    sequence, updated incrementally (the sequence only grows). One table for every size (a
    key's length is its size): a lookup chance costs the host a few µs of a step."""

    def __init__(self, sizes: range) -> None:
        self.sizes = sizes
        self.ends: dict[tuple[int, ...], int] = {}
        self.seen = 0  # ends below this are indexed

    def update(self, tokens: Sequence[int], upto: int | None = None) -> None:
        """Indexes tokens[:upto] (all of them when None) past those indexed already."""
        total = len(tokens) if upto is None else min(upto, len(tokens))
        first = max(1, self.seen)
        if first >= total:
            return
        least, most = self.sizes[0], self.sizes[-1]
        base = max(0, first - most)  # the new positions' n-grams, copied once
        new = tuple(tokens[base:total])
        for n in range(least, most + 1):  # an n-gram ending at `end` has a next
            lo = max(first, n)  # ends lo.. in order: the latest wins
            at = lo - base - n  # new[at + i + j] is token j of the n-gram ending at lo + i
            cols = [new[at + j : total - base - n + j] for j in range(n)]
            self.ends.update(zip(zip(*cols), range(lo, total)))  # built in C, not token by token
        self.seen = total

    def follow(self, context: Sequence[int], corpus: Sequence[int], k: int) -> list[int]:
        """What followed the longest indexed n-gram that ends `context`, up to k tokens."""
        tail = tuple(context[-self.sizes[-1] :])
        for n in reversed(self.sizes):
            if len(tail) < n:
                continue
            end = self.ends.get(tail[len(tail) - n :])
            if end is not None:
                return corpus[end : end + k]
        return []


class NgramDrafter(Drafter, LaneDrafter):
    guesses = True

    def __init__(self, max_n: int = 4, min_n: int = 2) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.index = NgramIndex(range(min_n, max_n + 1))

    def for_request(self, req=None) -> NgramDrafter:
        return NgramDrafter(self.max_n, self.min_n)

    def read_prompt(self, prompt: list[int], upto: int) -> None:
        # a long prompt indexed as its chunks are read (the host's time beside the card's),
        # not all at the first lookup: the same table either way
        self.index.update(prompt, upto)

    def propose(self, tokens: Sequence[int], output: list[int], k: int) -> list[int]:
        # the n-gram that ends `tokens` has no next token yet: not indexed
        self.index.update(tokens)
        return self.index.follow(tokens, tokens, k)


class PredictionDrafter(Drafter, LaneDrafter):
    """Drafts from a predicted reply: what followed the reply's last tokens in the prediction
    (drafting starts after the first token, which the prompt's last row chooses)."""

    guesses = True

    def __init__(self, prediction: tuple[int, ...], max_n: int = 4) -> None:
        self.prediction = list(prediction)
        self.index = NgramIndex(range(1, max_n + 1))
        self.index.update(self.prediction)

    def for_request(self, req=None) -> PredictionDrafter:
        return self

    def propose(self, tokens: list[int], output: list[int], k: int) -> list[int]:
        return self.index.follow(output, self.prediction, k)


@dataclass(frozen=True)
class DrafterWeights:
    """A drafter's weights read before the engine fits its pools to the memory left (the MTP
    head, a DFlash model; None for ngram), and what a KV page costs its own pool, which spans
    the target's pages."""

    weights: object | None = None
    page_bytes: int = 0


def load_drafter(method: str, target, page_size: int) -> DrafterWeights:
    """`method`'s weights for `target` (refused by name before any is read)."""
    if method == "ngram":
        return DrafterWeights()
    if method == "mtp":
        from .mtp import MTPDrafter as kind

        weights = kind.load_head(target)
    else:
        check_drafter_path(method, target.config)
        from ..models.dflash import load_dflash
        from .dflash import DFlashDrafter as kind

        weights = load_dflash(method, target)
    return DrafterWeights(weights, kind.kv_shape(target, weights).page_bytes(page_size))


def make_drafter(method: str, target=None, caches=None, weights=None) -> Drafter:
    """The engine's drafter by name (`target`, `caches` and the `weights` load_drafter read
    given once the target is loaded); refused by name before any weight is read."""
    if method == "ngram":
        return NgramDrafter()
    if method == "mtp":
        from .mtp import MTPDrafter

        return MTPDrafter(target, caches, weights)
    check_drafter_path(method, target.config if target is not None else None)
    from .dflash import DFlashDrafter

    return DFlashDrafter(target, caches, weights)


def check_drafter_path(method: str, target=None) -> None:
    """A drafter folder: refused by name (a kind we do not serve, or bound to another target
    when `target`, a ModelConfig or a checkpoint folder, is given), reading no weights."""
    from ..models.dflash import check_dflash, read_config

    path = Path(method)
    if not path.is_dir():
        raise NotStockDrafter(f"--draft {method!r}: not 'ngram', 'mtp' or a drafter folder")
    if target is None:
        read_config(path)
        return
    if not hasattr(target, "hidden_size"):
        from ..config import ModelConfig

        target = ModelConfig.from_dir(target)
    check_dflash(path, target)
