"""Structured outputs: a request's grammar (llguidance) masks the tokens it may take next.

The mask at a position is a pure function of the grammar and the request's own tokens before it:
a matcher follows those tokens (rolled back and fed again when asked about an earlier position,
as a drafter's check would), so company and scheduling never change it. With `after` set, the
grammar starts after the first such token of the reply (the answer after a thinking trace)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import InvalidRequest


@dataclass(frozen=True)
class Grammar:
    """What a request's reply must match: an llguidance grammar (JSON or Lark, as its
    `grammar_from_*` functions write them), from the token after `after` on when it is set."""

    source: str
    after: int | None = None


class GrammarBook:
    """The vocabulary as llguidance reads it (built once, when the first grammar arrives)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int]) -> None:
        self.hf = getattr(tokenizer, "hf", None)
        self.vocab_size, self.eos_ids = vocab_size, eos_ids
        self._tok = None

    def tokenizer(self):
        if self._tok is None:
            if self.hf is None:
                raise InvalidRequest("a grammar needs the checkpoint's tokenizer", "grammar")
            import llguidance.hf

            eos = getattr(self.hf, "eos_token_id", None)
            self._tok = llguidance.hf.from_tokenizer(
                self.hf, self.vocab_size, eos_token=eos if eos is not None else self.eos_ids[0]
            )
        return self._tok

    def check(self, grammar: Grammar) -> str:
        """'' when the grammar compiles against this vocabulary, else llguidance's message."""
        from llguidance import LLMatcher

        return LLMatcher.validate_grammar(grammar.source, self.tokenizer())

    def matcher(self, grammar: Grammar) -> Matcher:
        from llguidance import LLMatcher

        m = LLMatcher(self.tokenizer(), grammar.source, log_level=0)
        if m.is_error():
            raise InvalidRequest(f"the grammar does not compile: {m.get_error()}", "grammar")
        return Matcher(m, grammar.after, self.vocab_size, self.eos_ids)


@dataclass
class Matcher:
    """One request's matcher and the tokens it has consumed."""

    m: object  # llguidance.LLMatcher
    after: int | None
    vocab_size: int
    eos_ids: list[int]
    fed: list[int] = field(default_factory=list)

    def _governed(self, output_ids: list[int]) -> list[int] | None:
        """The tokens the grammar has to account for, or None while it has not started."""
        if self.after is None:
            return list(output_ids)
        if self.after not in output_ids:
            return None
        return list(output_ids[output_ids.index(self.after) + 1 :])

    def _follow(self, tokens: list[int]) -> bool:
        common = 0
        for a, b in zip(self.fed, tokens):
            if a != b:
                break
            common += 1
        if common < len(self.fed):
            self.m.rollback(len(self.fed) - common)
            del self.fed[common:]
        for t in tokens[common:]:
            if not self.m.consume_token(t):
                return False
            self.fed.append(t)
        return True

    def allowed(self, output_ids: list[int]) -> torch.Tensor | None:
        """bool [V]: the tokens the grammar allows after `output_ids`; None: no constraint yet."""
        words = self.words(output_ids)
        return None if words is None else unpack(torch.from_numpy(words), self.vocab_size)

    def words(self, output_ids: list[int]) -> np.ndarray | None:
        """`allowed` as packed int32 words (bit t % 32 of word t // 32 for token t), an eighth
        of the mask's bytes to send to the device; None: no constraint yet."""
        tokens = self._governed(output_ids)
        if tokens is None:
            return None
        n = (self.vocab_size + 31) // 32
        out = np.zeros(n, dtype=np.uint32)
        if self._follow(tokens) and not self.m.is_error():
            got = np.frombuffer(bytearray(self.m.compute_bitmask()), dtype=np.uint32)[:n]
            out[: got.shape[0]] = got
        if self.vocab_size % 32:  # no token past the vocabulary
            out[-1] &= np.uint32((1 << (self.vocab_size % 32)) - 1)
        if not out.any():  # the grammar is done (or broken): the reply may only end
            return end_only(self.vocab_size, self.eos_ids)
        return out.view(np.int32)


def end_only(vocab_size: int, eos_ids) -> np.ndarray:
    """Packed words allowing only the end-of-reply tokens."""
    out = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)
    for e in eos_ids:
        out[e // 32] |= np.uint32(1 << (e % 32))
    return out.view(np.int32)


def unpack(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [..., V] from packed int32 words [..., ceil(V/32)], on the words' device."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words[..., None] >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()
