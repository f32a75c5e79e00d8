"""The `mtp` drafter: Qwen3.5's own multi-token-prediction head (models/mtp.py) drafting for
its target. It only guesses; the verify pass decides every token.

The head keeps its own KV cache, one attention layer over the same pages and rows as the
target's (a lane's row r of the target is row r of the head), so it needs no allocation of its
own per lane. After each pass the lane keeps the target's post-final-norm state of every row
whose input and next token are committed (position p: h[p] with t[p+1]); when it next proposes,
the head reads them in one call, writing its KV rows (a lane whose gate is closed pays nothing);
its last row's logits give the first draft, and each further draft feeds the head's own output
back in at the next position (those speculative KV rows are rewritten once the target's state
for the position exists). On a GPU whose passes replay CUDA graphs, the catch-up and the chain
replay graphs of their own (runner/mtp_graph.py).
"""

from __future__ import annotations

import torch

from ..cache import KVShape, ModelCaches
from ..models.mtp import MTPHead, load_mtp
from ..models.qwen3_5 import Qwen35Model
from ..runner.model_runner import SMALL_MODEL_BYTES
from ..runner.mtp_graph import MTPGraphs
from ..util import join, longs
from .base import Drafter, LaneDrafter
from .mtp_lanes import propose_lanes


def head_dtype(target: Qwen35Model) -> torch.dtype:
    """float32 for a small model on the CPU, where a one-row bf16 product costs about three
    float32 ones (measured on the demo head's shapes); else the target's dtype (the copies of
    its weights and output table would be large)."""
    small = target.weight_bytes < SMALL_MODEL_BYTES
    return torch.float32 if target.device.type == "cpu" and small else target.dtype


class MTPDrafter(Drafter):
    reads_states = True
    holds_states = True  # rows wait for a proposal: each pass's rows copied once for all lanes

    def __init__(self, target: Qwen35Model, caches: ModelCaches, head: MTPHead):
        """`head`: read beforehand (`load_head`, by drafters.lookup.load_drafter), so that the
        pools were fitted beside its KV pool."""
        self.target, self.head = target, head
        kv = caches.kv
        self.kv = self.kv_shape(target, self.head).pool(kv.num_pages, kv.page_size, target.device)
        target.keep_hidden = True
        self.graphs: MTPGraphs | None = None  # the head's steps as CUDA graphs (use_graphs)

    @staticmethod
    def load_head(target: Qwen35Model) -> MTPHead:
        return load_mtp(target, target.path, head_dtype(target))

    @staticmethod
    def kv_shape(target: Qwen35Model, head: MTPHead) -> KVShape:
        """Its own KV pool over the target's pages: the head's one attention layer."""
        cfg = target.config
        return KVShape(1, cfg.num_kv_heads, cfg.head_dim, head.fc.weight.dtype)

    def use_graphs(self, context: int, most: int) -> None:
        """Drafts of up to `most` tokens replay the head's steps from CUDA graphs (the engine
        asks when its passes replay graphs: eager head steps would cost more than the pass)."""
        rows = MTPLane.MOST_PENDING  # a lane never holds more rows than that
        self.graphs = MTPGraphs(self.head, self.target, self.kv, context, most, rows)

    BATCH_FROM = 4  # with graphs, fewer proposing lanes replay their own (not timed apart yet)

    def batches(self, lanes: int) -> bool:
        """Whether `lanes` proposing lanes share the head's passes (mtp_lanes.py): with CUDA
        graphs, from BATCH_FROM lanes; without, a lane's plain-torch steps are cheaper."""
        return self.graphs is not None and lanes >= self.BATCH_FROM

    def propose_many(self, asks: list[tuple]) -> list[list[int] | torch.Tensor]:
        """With graphs, each lane's drafts stay on the device: the host plans and launches the
        verify pass while the head's steps run, and reads the drafts with the pass's picks."""
        if self.batches(len(asks)):
            return propose_lanes(self, [(lane, tokens, k) for lane, tokens, _, k in asks])
        keep = self.graphs is not None
        return [lane.propose(tokens, out, k, on_device=keep) for lane, tokens, out, k in asks]

    def features(self, target: Qwen35Model) -> torch.Tensor:
        """What it reads of each pass: the post-final-norm states of every row."""
        return target.hidden

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

    @property
    def cold_runs(self) -> int:
        return self.graphs.cold_runs if self.graphs is not None else 0

    def for_request(self, req) -> MTPLane:
        return MTPLane(self, req)

    def run(self, kv_rows: torch.Tensor, start: int, tokens: list[int], hidden: torch.Tensor):
        """The head over positions start.. of the lane whose KV rows are `kv_rows`: (last row's
        logits, every row's output)."""
        ids = longs(tokens, self.target.device)
        with torch.inference_mode():
            return self.head.forward(
                self.target,
                ids,
                hidden,
                start,
                kv_rows[: start + len(tokens)],
                (self.kv.k[0], self.kv.v[0]),
            )


class MTPLane(LaneDrafter):
    """One request's head state: how far its KV rows are written, the target states observed but
    not yet run through the head, and the last row's output."""

    MOST_PENDING = 64  # rows held before the head runs them anyway (bounds a lane's memory)

    def __init__(self, drafter: MTPDrafter, req) -> None:
        self.drafter, self.req = drafter, req
        self.done = 0  # positions whose head KV row holds the target's state
        self.upto = 0  # positions observed: done.. are held in `pending`
        self.pending: list[torch.Tensor] = []
        self.logits: torch.Tensor | None = None  # predicts the token at position done + 1
        self.out: torch.Tensor | None = None  # the head's output at position done - 1

    def observe(self, start: int, hidden: torch.Tensor) -> None:
        """hidden: the target's states of positions start.. from the pass just run (the engine's
        copy of the pass: held as views). They are run through the head when a proposal needs
        them: while the lane's gate is closed the head costs nothing."""
        req = self.req
        if start > self.upto:  # resumed from the prompt cache: the head's rows there are not ours
            self.done = self.upto = start
            self.pending.clear()
        last = min(start + hidden.shape[0] - 1, req.num_tokens - 2)  # its next token committed
        if last < self.upto:
            return
        self.pending.append(hidden[self.upto - start : last - start + 1])  # the engine's copy
        self.upto = last + 1
        if self.upto - self.done >= self.MOST_PENDING:
            self._catch_up()

    def held(self, tokens: list[int]) -> tuple[list[int], list[torch.Tensor]] | None:
        """(t[p+1], h[p]) of the held rows whose next token is read back (an overlapped pass's
        last row waits for its token, still on the device), or None when there are none; the
        states as the held pieces, in order (each reader copies them once, where it needs them)."""
        ids = tokens[self.done + 1 : self.upto + 1]
        if not ids:
            return None
        pieces, left = [], len(ids)
        for piece in self.pending:
            pieces.append(piece[:left])
            left -= pieces[-1].shape[0]
            if not left:
                break
        return ids, pieces

    def ran(self, n: int) -> None:
        """The head ran the first n held rows: the rest stay held."""
        rest = torch.cat(self.pending)[n:] if self.done + n < self.upto else None
        self.done += n
        self.pending = [rest] if rest is not None else []

    def _catch_up(self) -> bool:
        """The head over the held rows in one call (False when none can run). From a catch-up
        graph when the drafter has them (its first draft and output then wait in the graphs'
        buffers, `logits` None), else eager."""
        held = self.held(self.req.all_ids)
        if held is None:
            return False
        ids, pieces = held
        graphs = self.drafter.graphs
        if graphs is not None and len(ids) <= graphs.rows:
            graphs.catch_up(self.req.rows(), self.done, ids, pieces)
            self.logits = self.out = None
        else:
            self.logits, out = self.drafter.run(self.req.lane.kv_rows, self.done, ids, join(pieces))
            self.out = out[-1:]
        self.ran(len(ids))
        return True

    def propose(
        self, tokens: list[int], output: list[int], k: int, on_device: bool = False
    ) -> list[int] | torch.Tensor:
        """Up to k drafts; with graphs and `on_device`, a tensor of them left on the device."""
        fresh = self._catch_up()
        if self.done != len(tokens) - 1:
            return []
        graphs = self.drafter.graphs
        if graphs is not None:
            if self.logits is not None:  # an eager catch-up: its start into the chain's buffers
                graphs.set_start(torch.argmax(self.logits), self.out)
            elif not fresh:  # caught up earlier: the buffers may hold another lane's start
                return []
            return graphs.chain(self.req.rows(), len(tokens) - 1, k, read=not on_device)
        if self.logits is None:
            return []
        drafts = [int(torch.argmax(self.logits))]
        out, pos = self.out, len(tokens) - 1
        for _ in range(k - 1):
            logits, out = self.drafter.run(self.req.lane.kv_rows, pos, drafts[-1:], out)
            drafts.append(int(torch.argmax(logits)))
            pos += 1
        return drafts
