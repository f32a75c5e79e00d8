"""What every drafter implements (lookup.py names them): the engine's `Drafter`, which
makes a `LaneDrafter` for each request; and a request's drafting state (`LaneDraft`, its `Gate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..runner.plan import PENDING
from ..util import join
from .gate import Gate


class LaneDrafter:
    """One request's drafter: proposes, and (for drafters that read the target's states) is
    shown each pass's post-final-norm rows of its lane."""

    def propose(self, tokens: Sequence[int], output: list[int], k: int) -> list[int]:
        """Up to k tokens to follow `tokens` (the request's committed ids, a view that slices
        as a list; `output` is the reply part of them)."""
        raise NotImplementedError

    def observe(self, start: int, hidden) -> None:
        """The lane's rows of the target's states from position `start` (read by mtp, dflash)."""

    def read_prompt(self, prompt: list[int], upto: int) -> None:
        """The lane's prompt has been fed up to `upto` (a pass launched): a lookup may index it
        while the card computes, rather than at its first chance."""

    # it drafts without reading the lane's last token (chosen on the device, not read back):
    # the lane's chance is then taken in an overlapped step, its verify pass launched before
    # that token is read. False: the engine reads the token first
    guesses = False

    def guess(self, tokens: Sequence[int], output: list[int], k: int) -> list[int]:
        """Up to k tokens to follow `tokens` and the unread token after them: the proposal after
        the read tokens, its first token taken as the guess of the unread one (a wrong guess
        only costs the drafts: the walk keeps a draft only where the target chose it)."""
        return self.propose(tokens, output, k + 1)[1:]


class Drafter:
    """The engine's drafter: makes each request's `LaneDrafter`. `reads_states`: it reads the
    target's post-final-norm states (`features`) after each pass; `use_graphs`: it records steps
    of its own as CUDA graphs; `nbytes`: the memory it holds beside the target."""

    reads_states = False
    holds_states = False  # keeps observed rows past the pass: the engine copies them for it

    def for_request(self, req) -> LaneDrafter:
        """A fresh drafter for one request (its own lookup tables)."""
        raise NotImplementedError

    def use_graphs(self, context: int, most: int) -> None:
        """The runner replays CUDA graphs; a drafter with steps of its own records them."""

    def propose_many(self, asks: list[tuple]) -> list[list[int] | torch.Tensor]:
        """Drafts for several lanes in one call: asks are (LaneDrafter, tokens, output, k). A
        drafter with steps of its own may batch them; the plain way asks each lane in turn. A
        lane's drafts may come as a tensor on the pass's device, not read back: the verify pass
        feeds them from there and the walk reads them after it (`LaneDraft.take`)."""
        return [lane.propose(tokens, output, k) for lane, tokens, output, k in asks]

    def features(self, target):
        """What it reads of the target's states (None: nothing)."""
        return None

    @property
    def nbytes(self) -> int:
        return 0

    @property
    def cold_runs(self) -> int:
        """Its steps so far that compiled or recorded a graph rather than replayed one (a
        drafting gate does not price a pass whose proposal ran one)."""
        return 0


@dataclass
class LaneDraft:
    """One request's drafting: its proposal in flight and where its state copy is."""

    drafters: tuple[LaneDrafter, ...]
    gate: Gate = field(default_factory=Gate)
    proposal: list[int] = field(default_factory=list)
    source: LaneDrafter | None = None  # the drafter of the proposal in flight
    start: int = -1  # lane.computed when the state was copied (-1: no verify in flight)
    spare: int = -1  # the spare state slot holding the copy
    forked: int = 0  # committed rows the pass feeds the copy too (its state then follows them)
    real: int = 0  # the drafter's own tokens of the proposal (after them: its last repeated)
    proposed: int = 0
    accepted: int = 0
    prediction_accepted: int = 0
    prediction_rejected: int = 0
    # the proposal's tokens on the device, not read back (`proposal` holds PENDING for each):
    # the verify pass's rows feed them from here (engine/overlap.py, `fed`), the walk reads them
    on_device: torch.Tensor | None = None

    def take(self, found: list[int] | torch.Tensor, room: int) -> None:
        """The drafter's proposal, at most `room` tokens: ids, or a tensor of them left on the
        device (so the host launches the verify pass while the drafter's steps run)."""
        if isinstance(found, torch.Tensor):
            self.on_device = found[:room]
            self.proposal = [PENDING] * self.on_device.shape[0]
        else:
            self.on_device, self.proposal = None, list(found)[:room]

    def pad(self, room: int) -> None:
        """A short proposal padded to `room` tokens with its last (a graph's pass shape)."""
        more = room - len(self.proposal)
        if more <= 0 or not self.proposal:
            return
        if self.on_device is not None:
            self.on_device = torch.cat([self.on_device, self.on_device[-1:].expand(more)])
        self.proposal += self.proposal[-1:] * more

    def cut(self, keep: int) -> None:
        """Keeps the first `keep` drafts (the rows the pass has room for)."""
        del self.proposal[keep:]
        if self.on_device is not None:
            self.on_device = self.on_device[:keep] if self.proposal else None

    def drop(self) -> None:
        """No proposal in flight."""
        self.proposal, self.on_device = [], None

    def read_prompt(self, prompt: list[int], upto: int) -> None:
        for drafter in self.drafters:
            drafter.read_prompt(prompt, upto)


def unread(drafts: list[LaneDraft]) -> torch.Tensor | None:
    """The proposals left on the device, as one tensor (None when none is): read back after the
    pass that fed them was launched, in the copy that reads its picks (Sampler.greedy_picks)."""
    waiting = [d.on_device for d in drafts if d.on_device is not None]
    return join(waiting) if waiting else None


def take_read(drafts: list[LaneDraft], ids: list[int]) -> None:
    """The proposals `unread` gave, their ids now read back, kept on the host."""
    at = 0
    for d in drafts:
        if d.on_device is not None:
            n = len(d.proposal)
            d.proposal, d.on_device, at = ids[at : at + n], None, at + n
