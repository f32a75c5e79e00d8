"""What every drafter implements (engine/drafters.py names them): the engine's `Drafter`, which
makes a `LaneDrafter` for each request."""

from __future__ import annotations


class LaneDrafter:
    """One request's drafter: proposes, and (for drafters that read the target's states) is
    shown each pass's post-final-norm rows of its lane."""

    def propose(self, tokens: list[int], output: list[int], k: int) -> list[int]:
        """Up to k tokens to follow `tokens` (the request's committed ids; `output` is the reply
        part of them)."""
        raise NotImplementedError

    def observe(self, start: int, hidden) -> None:
        """The lane's rows of the target's states from position `start` (read by mtp, dflash)."""


class Drafter:
    """The engine's drafter: makes each request's `LaneDrafter`. `reads_states`: it reads the
    target's post-final-norm states (`features`) after each pass; `use_graphs`: it records steps
    of its own as CUDA graphs; `nbytes`: the memory it holds beside the target."""

    reads_states = False

    def for_request(self, req) -> LaneDrafter:
        """A fresh drafter for one request (its own lookup tables)."""
        raise NotImplementedError

    def use_graphs(self, context: int, most: int) -> None:
        """The runner replays CUDA graphs; a drafter with steps of its own records them."""

    def features(self, target):
        """What it reads of the target's states (None: nothing)."""
        return None

    @property
    def nbytes(self) -> int:
        return 0
