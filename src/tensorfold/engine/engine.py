"""The engine: requests in, one shared forward pass per step, token events out.

add_request and cancel may be called from any thread; step() runs on one thread.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..cache.budget import check_unpacked_fits, free_bytes
from ..cache.prefix_cache import PrefixCache
from ..cache.sizing import PoolPlan
from ..drafters.choice import DraftConfig
from ..drafters.lookup import DrafterWeights, load_drafter
from ..errors import ConfigError, QueueFull
from ..ops.gated_delta import grid_chunked
from ..runner.cuda_graph import LONE_PIECES, lane_buckets
from ..runner.launch import make_runner
from ..runner.model_runner import SMALL_MODEL_BYTES
from .admission import make_request
from .constraints import GrammarBook
from .drafting import ASKS, BUSY, QUIET, Drafting
from .inbox import Inbox
from .output import Output
from .overlap import Chosen, fed
from .passes import plan_pass
from .request import Request, SamplingParams, Status, TokenEvent, Watch
from .sampler import Sampler
from .scheduler import Scheduler, SchedulerConfig
from .stats import EngineFacts, EngineStats, MemoryReport, engine_stats, memory_report

if TYPE_CHECKING:  # the engine takes any loaded model; only the type is named
    from ..models.qwen3_5 import Qwen35Model

PAGE_SIZE = 16
# past this many lanes a decode pass's products take the dequantize-first shape on a GPU, each
# weight dequantized every step unless held (wants_unpacked)
MANY_LANES = 128
FREE_SHARE = 0.8  # of the free memory, what held weights and the pools may take unasked


@dataclass(frozen=True)
class EngineConfig(SchedulerConfig):
    page_size: int = PAGE_SIZE
    prompt_cache_bytes: int = 0  # 0 turns the prompt cache off
    threads: int | None = None  # CPU threads (None: by model size)
    cuda_graphs: bool = True  # on a GPU, replay decode and verify passes as CUDA graphs
    draft: str | None = None  # drafter: "ngram", "mtp" or a drafter path (None: plain decoding)
    draft_tokens: int = 4  # tokens drafted per verify pass
    gdn_form: str = "recurrence"  # the gated delta rule's exact form (ops.gated_delta.FORMS)
    max_tokens: int | None = None  # a request's reply limit when it sets none (None: the context)
    # plan and launch pass N+1 while pass N's tokens are chosen (engine/overlap.py); None: on a
    # GPU for a whole model
    overlap: bool | None = None
    # hold each packed weight dequantized too: faster products (~2 bytes a weight more on a
    # GPU, 4 in a float32 CPU run); None: where it pays and fits (wants_unpacked)
    unpacked_weights: bool | None = None
    # a prompt piece alone replays a graph of no decoding lane (cuda_graph.LONE_PIECES); False:
    # such a piece runs eagerly
    lone_graphs: bool = True


class Engine:
    def __init__(
        self, model: Qwen35Model, tokenizer=None, config: EngineConfig = EngineConfig()
    ) -> None:
        self.model, self.tokenizer, self.config = model, tokenizer, config
        cfg = model.config
        # a whole model's decode graphs come in lane-count buckets, padded with scratch lanes
        buckets = model.group is None and config.cuda_graphs and model.device.type == "cuda"
        # a drafter's weights are read first: the pools fit beside them and its KV pool
        drafter = DrafterWeights()
        if config.draft and model.group is None:
            drafter = load_drafter(config.draft, model, config.page_size)
        plan = PoolPlan.for_model(
            model,
            config.parallel,
            config.context,
            config.page_size,
            config.prompt_cache_bytes,
            spares=bool(config.draft) and model.group is None,
            chunk_form=grid_chunked(config.gdn_form),
            padding=buckets,
            draft_page_bytes=drafter.page_bytes,
        )
        if wants_unpacked(model, config.unpacked_weights, config.parallel, plan.nbytes):
            hold_unpacked(model)
        plan = plan.fitted(model.device, config.context)
        self.kv_contexts = plan.whole_contexts(config.context)
        self.caches = plan.build(model.device, config.parallel, config.context)
        model.set_gdn_form(config.gdn_form)
        self.prefix_cache = PrefixCache(self.caches.kv, config.prompt_cache_bytes)
        self.runner = make_runner(
            model, self.caches, config.threads, config.cuda_graphs, config.context
        )
        self.scheduler = Scheduler(config, self.caches.kv, self.caches.states, self.prefix_cache)
        self.drafting = Drafting(
            DraftConfig(config.draft, config.draft_tokens),
            self.caches,
            config.parallel,
            model,
            allowed=model.group is None,
            writes=not grid_chunked(config.gdn_form),  # the forms whose kernels take it
            weights=drafter.weights,
        )
        if model.group is None:  # verify passes (1 + K rows a lane) and recomputing ones too
            self.runner.graph_rows = frozenset(range(1, 2 + config.draft_tokens))
            if buckets:
                self.runner.pad_lanes(lane_buckets(config.parallel))
                self.drafting.use_graphs(config.context)
                self.scheduler.lookahead = config.draft_tokens if config.draft else 0
                # prompt pieces alone and beside decoding lanes, in graphs; fla's graph layout
                # needs as many rows in every lane, the other forms read each lane's rows from
                # its bounds
                if config.gdn_form != "chunk":
                    self.runner.lone_pieces = LONE_PIECES if config.lone_graphs else ()
                    if config.mixed_chunk:
                        self.runner.piece_rows = config.mixed_chunk
                        self.scheduler.mixed_room = self.runner.mixed_room
        self.eos_ids = set(cfg.eos_token_ids) | set(getattr(tokenizer, "eos_ids", ()))
        self.grammars = GrammarBook(tokenizer, cfg.vocab_size, sorted(self.eos_ids))
        self.sampler = Sampler(self.runner.greedy, self.eos_ids, self.grammars)
        self.output = Output(tokenizer, self.eos_ids)
        auto = model.device.type == "cuda" and model.group is None
        self.overlap = auto if config.overlap is None else config.overlap
        if self.overlap and model.group is not None:
            raise ValueError("overlapped passes need a whole model (not a tensor split)")
        self._chosen: Chosen | None = None  # the last pass's tokens, not read back yet
        self._proposing = 0.0  # seconds the last proposals took (the next verify's price)
        # cold runs (runner and drafter) counted as the step before and this one proposed
        self._cold_marks = (0, 0)
        self.inbox = Inbox(config.max_queue)
        self.wakeup = self.inbox.wakeup  # the server's loop waits on it
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._passes = 0

    # -- admission (any thread) ----------------------------------------------------------
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        choice: int = 0,
        watch: Watch | None = None,
        draft: bool = True,
        prediction: list[int] | None = None,
    ) -> Request:
        """Queues one choice of a prompt (`choice` keys its random numbers with the seed);
        `watch` observes it without changing a token. `draft=False` serves it without drafting;
        `prediction` (token ids of a predicted reply) drafts from it (OpenAI Predicted Outputs)."""
        c = self.config
        req = make_request(
            request_id or f"req-{next(self._ids)}",
            prompt_ids,
            params,
            self.model.config.vocab_size,
            c.context,
            c.max_tokens,
            choice,
            watch,
        )
        req.lane.draft = self.drafting.lane(req, draft, prediction)
        self._requests[req.request_id] = req
        try:
            self.inbox.put(req, len(self.scheduler.waiting))
        except QueueFull:
            self._requests.pop(req.request_id, None)
            raise
        return req

    def cancel(self, request_id: str) -> None:
        self.inbox.cancel(request_id)

    # -- the loop (one thread) -----------------------------------------------------------
    def has_work(self) -> bool:
        waiting = self.inbox or self.scheduler.waiting or self.scheduler.running
        return bool(waiting or self._chosen is not None)

    def step(self) -> list[TokenEvent]:
        """One pass; with overlap, the tokens of the pass before are committed while it runs."""
        events = self._take_inbox()
        mode = self._overlap_mode()
        if mode == QUIET:
            return events + self._overlapped_step()
        if mode == ASKS:  # its drafter proposes from the last tokens: read them first
            events += self._settle()
            self.scheduler.admit()
            self._propose()
            return events + self._overlapped_step(proposed=True)  # plain if a lane drafts
        return events + self._settle() + self._step()

    def _overlap_mode(self) -> str:
        """A watched lane (a tool's seams, its fingerprint at the end) takes plain steps, and
        so does a pass in which a lane has drafts in flight (BUSY); a lane
        whose gate asks (ASKS) has the last tokens read first, and overlaps again when it
        proposes nothing (Drafting.stillness: overlapped steps while every drafting lane
        rests)."""
        if not self.overlap:
            return BUSY
        running, waiting = self.scheduler.running, self.scheduler.waiting
        if any(req.watch is not None for req in itertools.chain(running, waiting)):
            return BUSY
        return self.drafting.stillness(running)  # a waiting request has no lane yet

    def _overlapped_step(self, proposed: bool = False) -> list[TokenEvent]:
        """`proposed`: the lanes were admitted and have proposed for it already; a lane that
        drafts makes it a plain step."""
        start = time.perf_counter()
        waits = self._chosen is not None  # on the pass before: the step lasts a pass's period
        if not proposed:
            self.scheduler.admit()
            self._propose()  # a closed gate counts its chance
        if any(req.drafting for req in self.scheduler.running):  # a verify pass: its lanes'
            return self._step(proposed=True)  # unread tokens fed on the device, read meanwhile
        work = self.scheduler.schedule()
        ready, hidden = [], None
        if work:
            plan = plan_pass(work, fed=fed(work, self._chosen))
            logits = self.runner.execute(plan)
            hidden = self.drafting.features(self.model)
            self._passes += 1
            for i, w in enumerate(work):
                if self._advance(w.request, w.rows, logits.get(i)):
                    ready.append((w.request, logits[i][-1]))
        events = self._settle()  # the pass before's tokens, read while this one runs
        ready = [(req, row) for req, row in ready if req.status == Status.RUNNING]
        if ready:
            self._chosen = Chosen.pick(self.sampler, ready)
        awake = True  # a lane's gate within its last chances before a retry
        if hidden is not None:  # its rows' next tokens are chosen (pending): as a plain step's
            awake = self.drafting.observe(work, plan, hidden)
        # a plain pass's price (while every head rests, none is near a retry to read it); a
        # step with no pass to wait on times the host's launch alone
        priced = awake and work and waits and self.drafting.priced
        priced = priced and self.drafting.prices.wants_plain() and self._warm(True)
        shape = self.drafting.shape(work) if priced else None
        if shape is not None:
            self.drafting.prices.record(*shape, time.perf_counter() - start)
        return events

    def _propose(self) -> None:
        """The lanes propose (Drafting.propose); how long it took is kept for the verify pass
        that carries the drafts: a drafter's own steps (the MTP head's catch-up and chain) are
        part of what that pass costs against a plain one."""
        if not self.drafting.priced:  # no lane drafts: nothing is timed
            self.drafting.propose(self.scheduler.running)
            return
        self._cold_marks = (self._cold_marks[1], self._cold_runs())
        start = time.perf_counter()
        self.drafting.propose(self.scheduler.running)
        self._proposing = time.perf_counter() - start

    def _cold_runs(self) -> int:
        d = self.drafting.default
        return self.runner.cold_passes + (d.cold_runs if d is not None else 0)

    def _warm(self, waited: bool) -> bool:
        """Whether no pass or proposal compiled or recorded a graph since this step proposed
        (`waited`: since the step before it proposed, whose pass this one waited on): its time
        is then a replay's, not a first run's, which a gate's price would carry for long."""
        return self._cold_runs() == self._cold_marks[0 if waited else 1]

    def _settle(self) -> list[TokenEvent]:
        """Commits the tokens chosen on the device and not read back yet (a lane that finished
        meanwhile, cancelled, drops its own)."""
        chosen, self._chosen = self._chosen, None
        if chosen is None:
            return []
        events = []
        for (req, row), (token, logprobs) in zip(chosen.ready, chosen.read()):
            if req.status == Status.RUNNING and req.lane.pending >= 0:
                req.lane.pending = -1
                events.append(self._commit(req, row, token, logprobs))
        return events

    def _step(self, proposed: bool = False) -> list[TokenEvent]:
        """A plain step: the pass, then its tokens chosen and read (`proposed`: the lanes have
        proposed for it already). Tokens of the pass before still on the device (a verify pass
        drafted while they were unread) are fed from there and read while this pass runs; a
        lane that ends on one of them drops its rows of this pass."""
        start = time.perf_counter()  # a generating pass's time prices drafting (its gate)
        if not proposed:
            self.scheduler.admit()
            self._propose()
        work = self.scheduler.schedule()
        if not work:
            return self._settle()
        start -= self._proposing if proposed else 0.0  # its drafter's steps are its price too
        shape = self.drafting.shape(work) if self.drafting.priced else None
        if shape is not None and shape[1] == 1:
            # not drafting costs an overlapped step (a plain pass waited on alone is no price);
            # a sequential engine's plain steps are timed as an overlapped one's: a few of them
            shape = None if self.overlap or not self.drafting.prices.wants_plain() else shape
        plan = plan_pass(work, self.drafting.before_pass(work), fed(work, self._chosen))
        logits = self.runner.execute(plan)
        hidden = self.drafting.features(self.model)  # before a catch-up pass replaces it
        self._passes += 1
        launched = time.perf_counter()
        events = self._settle()  # the price counts the host's launch and the wait on this pass
        start += time.perf_counter() - launched
        verified = self.drafting.after_pass(work, logits, self.sampler, self.output)
        ready = []
        for i, w in enumerate(work):
            done = verified.get(i)
            if w.request.status != Status.RUNNING:  # ended on the token read meanwhile
                continue
            if done is not None:
                events += done
                if done[-1].finished:  # the row of the token that ended it
                    self._finish(w.request, done[-1].finish_reason, logits[i][len(done) - 1])
            elif self._advance(w.request, w.rows, logits.get(i)):
                ready.append((w.request, logits[i][-1]))
        for (req, row), token in zip(ready, self.sampler.choose(ready)):
            events.append(self._commit(req, row, token))
        if self.drafting.wants_hidden:
            self.drafting.observe(work, plan, hidden)
        if shape is not None and self._warm(False):
            self.drafting.prices.record(*shape, time.perf_counter() - start)
        return events

    def _take_inbox(self) -> list[TokenEvent]:
        self.scheduler.waiting.extend(self.inbox.take())
        events = []
        for request_id in self.inbox.take_cancels():
            req = self._requests.get(request_id)
            if req is not None and req.status != Status.FINISHED:
                events.append(self._finish(req, "cancelled", None))
        return events

    def _advance(self, req: Request, rows: int, logits: torch.Tensor | None) -> bool:
        """Counts the rows computed; True when the lane now produces its next token."""
        lane = req.lane
        start = lane.computed
        lane.computed += rows
        if lane.computed in lane.cache_cuts:
            self._remember(req)
        if req.watch is not None:
            req.watch.passed(req, start, logits)
        if start < len(req.prompt_ids):
            if req.params.prompt_logprobs is not None:
                self.output.score_prompt(req, start, logits)
            if lane.draft is not None:  # its lookups index the rows just launched
                lane.draft.read_prompt(req.prompt_ids, lane.computed)
        return lane.computed == req.num_tokens

    def _commit(self, req: Request, row: torch.Tensor, token: int, logprobs=None) -> TokenEvent:
        event = self.output.commit(req, row, token, logprobs)
        if event.finished:
            self._finish(req, event.finish_reason, row)
        return event

    def _remember(self, req: Request) -> None:
        """Snapshot the lane into the prompt cache at its current cut."""
        lane = req.lane
        self.prefix_cache.insert(
            req.all_ids[: lane.computed], lane.pages, self.caches.states.snapshot(lane.slot)
        )

    def abandon_all(self) -> list[TokenEvent]:
        """After a failed pass: every request still queued or running ends with finish_reason
        "error" and gives back its lane, touching no device memory (the device may be lost)."""
        self.scheduler.waiting.extend(self.inbox.take())
        self.inbox.take_cancels()
        self._chosen = None
        events = []
        for req in list(self.scheduler.waiting) + list(self.scheduler.running):
            self.scheduler.finish(req)
            self.drafting.release(req)
            req.finish_reason = "error"
            self._requests.pop(req.request_id, None)
            events.append(TokenEvent(req.request_id, [], "", finished=True, finish_reason="error"))
        return events

    def _finish(self, req: Request, reason: str, logits) -> TokenEvent:
        watch = req.watch
        remember = reason != "cancelled" and self.prefix_cache.enabled
        if req.status == Status.RUNNING and (remember or (watch and watch.on_finish)):
            self.drafting.catch_up(req, self.runner)
        if req.status == Status.RUNNING and remember:
            self._remember(req)  # the end of the reply: the next chat turn resumes here
        if watch is not None and watch.on_finish is not None and req.status == Status.RUNNING:
            watch.on_finish(req, logits)
        req.finish_reason = reason
        req.lane.pending = -1  # a token chosen meanwhile is dropped
        self.drafting.release(req)
        self.scheduler.finish(req)
        self._requests.pop(req.request_id, None)
        return TokenEvent(req.request_id, [], "", finished=True, finish_reason=reason)

    def fingerprint(self, req: Request, logits: torch.Tensor | None) -> str:
        """The lane's states and KV rows as they stand, and `logits` (docs/exactness.md)."""
        return self.runner.fingerprint(req.rows(), logits)

    def run_until_done(self) -> None:
        while self.has_work():
            self.step()

    # -- what the server may read (any thread) ----------------------------------------------
    @property
    def facts(self) -> EngineFacts:
        return EngineFacts.of(self.model, self.config)

    def stats(self) -> EngineStats:
        """Queue, lanes and prompt-cache figures now (exact when read on the engine thread)."""
        return engine_stats(
            self.inbox.queued(len(self.scheduler.waiting)),
            list(self.scheduler.running),
            self._passes,
            self.prefix_cache,
            self.caches.kv,
            self.drafting.stats,
            self.runner.collective,
        )

    def memory(self) -> MemoryReport:
        ranks = tuple(self.runner.ranks_memory())  # a split: every rank's bytes
        d = self.drafting
        in_pool = d.lanes * self.caches.states.slot_nbytes if d.fork else 0
        return memory_report(
            self.model, self.caches, self.prefix_cache, d.spare_bytes, ranks, in_pool,
            self.kv_contexts,
        )  # fmt: skip

    def close(self) -> None:
        """Lets the other ranks of a split go (a no-op for a whole model)."""
        self.runner.close()


def wants_unpacked(
    model: Qwen35Model, asked: bool | None, parallel: int = 1, pools: int = 0
) -> bool:
    """--unpacked-weights as asked; unset, on for a whole model with packed weights where every
    pass would otherwise dequantize them: on the CPU when they take at most SMALL_MODEL_BYTES
    held (the demo's 4-bit file decodes ~2.5x faster), on a GPU past MANY_LANES lanes when they
    and the `pools` (bytes) fit in FREE_SHARE of the free memory (+36% at 256 lanes, 9B)."""
    if asked is not None:
        return asked
    total = model.unpacked_bytes(held=False)
    if model.group is not None or total == 0:
        return False
    if model.device.type == "cpu":
        return total <= SMALL_MODEL_BYTES
    room = free_bytes(model.device)
    need = total - model.unpacked_bytes()
    return parallel > MANY_LANES and room is not None and need + pools <= FREE_SHARE * room


def hold_unpacked(model: Qwen35Model) -> None:
    """--unpacked-weights: every packed product weight held dequantized too, checked against the
    device's free memory before any is made (a split's ranks hold their own weights: refused)."""
    if model.group is not None:
        raise ConfigError("--unpacked-weights is not offered with --tensor-parallel")
    check_unpacked_fits(model.unpacked_bytes(held=False) - model.unpacked_bytes(), model.device)
    model.hold_unpacked()
