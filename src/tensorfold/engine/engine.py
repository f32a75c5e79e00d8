"""The engine: requests in, one shared forward pass per step, token events out.

add_request and cancel may be called from any thread; step() runs on one thread.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..cache.prefix_cache import PrefixCache
from ..cache.sizing import PoolPlan
from ..errors import ContextOverflow, InvalidRequest, QueueFull, SplitRefused
from ..ops.sampling import token_rank, top_logprobs
from ..runner.launch import make_runner
from .constraints import GrammarBook
from .drafting import DraftConfig, Drafting, refuse_split_draft
from .output import Output
from .request import Request, SamplingParams, Status, TokenEvent, Watch
from .sampler import Sampler
from .scheduler import Scheduler, SchedulerConfig
from .stats import EngineFacts, EngineStats, MemoryReport, memory_report

if TYPE_CHECKING:  # the engine takes any loaded model; only the type is named
    from ..models.qwen3_5 import Qwen35Model

PAGE_SIZE = 16


@dataclass(frozen=True)
class EngineConfig(SchedulerConfig):
    page_size: int = PAGE_SIZE
    prompt_cache_bytes: int = 0  # 0 turns the prompt cache off
    threads: int | None = None  # CPU threads (None: by model size)
    cuda_graphs: bool = True  # on a GPU, replay decode and verify passes as CUDA graphs
    draft: str | None = None  # drafter: "ngram", "mtp" or a drafter path (None: plain decoding)
    draft_tokens: int = 4  # tokens drafted per verify pass
    gdn_form: str = "recurrence"  # the gated delta rule's exact form: "recurrence" or "chunk"
    max_tokens: int | None = None  # a request's reply limit when it sets none (None: the context)


class Engine:
    def __init__(
        self, model: Qwen35Model, tokenizer=None, config: EngineConfig = EngineConfig()
    ) -> None:
        self.model, self.tokenizer, self.config = model, tokenizer, config
        cfg = model.config
        plan = PoolPlan.for_model(
            model,
            config.parallel,
            config.context,
            config.page_size,
            config.prompt_cache_bytes,
            spares=bool(config.draft) and model.group is None,
            chunk_form=config.gdn_form == "chunk",
        )
        self.caches = plan.build(model.device, config.parallel, config.context)
        model.set_gdn_form(config.gdn_form)
        self.prefix_cache = PrefixCache(self.caches.kv, config.prompt_cache_bytes)
        self.runner = make_runner(
            model, self.caches, config.threads, config.cuda_graphs, config.context
        )
        self.scheduler = Scheduler(config, self.caches.kv, self.caches.states, self.prefix_cache)
        if model.group is not None and config.draft:
            raise SplitRefused(refuse_split_draft())
        self.drafting = Drafting(
            DraftConfig(config.draft, config.draft_tokens),
            self.caches,
            config.parallel,
            model,
            allowed=model.group is None,
        )
        if model.group is None:  # verify passes (1 + K rows a lane) and recomputing ones too
            self.runner.graph_rows = frozenset(range(1, 2 + config.draft_tokens))
            if self.runner.use_graphs:
                self.drafting.use_graphs(config.context)
        self.eos_ids = set(cfg.eos_token_ids) | set(getattr(tokenizer, "eos_ids", ()))
        self.grammars = GrammarBook(tokenizer, cfg.vocab_size, sorted(self.eos_ids))
        self.sampler = Sampler(self.runner.greedy, self.eos_ids, self.grammars)
        self.output = Output(tokenizer, self.eos_ids)
        self._inbox: deque[Request] = deque()
        self._cancels: deque[str] = deque()
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._passes = 0
        self.wakeup = threading.Event()

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
        prompt_ids = [int(t) for t in prompt_ids]
        self._validate(prompt_ids, params)
        rest = self.config.context - len(prompt_ids)
        max_tokens = params.max_tokens or min(rest, self.config.max_tokens or rest)
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        cuts = tuple(sorted(set(watch.cuts))) if watch is not None else ()
        req = Request(
            request_id or f"req-{next(self._ids)}",
            prompt_ids,
            params,
            max_tokens,
            seed,
            choice,
            watch,
            cuts,
        )
        req.draft = self.drafting.lane(req, draft, prediction)
        with self._lock:
            if len(self._inbox) + len(self.scheduler.waiting) >= self.config.max_queue:
                raise QueueFull(f"the queue is full ({self.config.max_queue} waiting)")
            self._requests[req.request_id] = req
            self._inbox.append(req)
        self.wakeup.set()
        return req

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        vocab = self.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(
                f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt"
            )
        bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
        bad += [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad:
            name = "logit_bias" if bad[0] in dict(params.logit_bias) else "stop_token_ids"
            raise InvalidRequest(
                f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param=name
            )
        want = len(ids) + (params.max_tokens or 1)
        if want > self.config.context:
            raise ContextOverflow(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens or 1}) = {want} exceeds "
                f"the context of {self.config.context} tokens",
                param="max_tokens",
            )

    def cancel(self, request_id: str) -> None:
        self._cancels.append(request_id)
        self.wakeup.set()

    # -- the loop (one thread) -----------------------------------------------------------
    def has_work(self) -> bool:
        return bool(
            self._inbox or self._cancels or self.scheduler.waiting or self.scheduler.running
        )

    def step(self) -> list[TokenEvent]:
        events = self._take_inbox()
        self.scheduler.admit()
        self.drafting.propose(self.scheduler.running)
        work = self.scheduler.schedule()
        if not work:
            return events
        forks = self.drafting.before_pass(work)
        spans, row = [], 0
        for w in work:
            spans.append((w.request, w.request.num_computed, row, w.rows))
            row += w.rows
        logits = self.runner.execute([(w.request, w.rows) for w in work] + forks)
        hidden = self.drafting.features(self.model)  # before a catch-up pass replaces it
        self._passes += 1
        ready = []
        for i, w in enumerate(work):
            if w.request.drafting:
                done = self.drafting.verify(w.request, logits[i], self.sampler, self.output)
                events += done
                if done[-1].finished:  # the row of the token that ended it
                    self._finish(w.request, done[-1].finish_reason, logits[i][len(done) - 1])
            elif self._advance(w.request, w.rows, logits.get(i)):
                ready.append((w.request, logits[i][-1]))
        for (req, row), token in zip(ready, self.sampler.choose(ready)):
            events.append(self._commit(req, row, token))
        if self.drafting.wants_hidden:
            self.drafting.observe(spans, hidden)
        return events

    def _drain_inbox(self) -> None:
        with self._lock:
            while self._inbox:
                self.scheduler.waiting.append(self._inbox.popleft())

    def _take_inbox(self) -> list[TokenEvent]:
        self._drain_inbox()
        events = []
        while self._cancels:
            req = self._requests.get(self._cancels.popleft())
            if req is not None and req.status != Status.FINISHED:
                events.append(self._finish(req, "cancelled", None))
        return events

    def _advance(self, req: Request, rows: int, logits: torch.Tensor | None) -> bool:
        """Counts the rows computed; True when the lane now produces its next token."""
        start = req.num_computed
        req.num_computed += rows
        if req.num_computed in req.cache_cuts:
            self._remember(req)
        if req.watch is not None:
            req.watch.passed(req, start, logits)
        if req.params.prompt_logprobs is not None and start < len(req.prompt_ids):
            self._score_prompt(req, start, logits)
        return req.num_computed == req.num_tokens

    def _score_prompt(self, req: Request, start: int, logits: torch.Tensor) -> None:
        """Each prompt row's logits score the prompt token after it."""
        ids, k = req.prompt_ids, req.params.prompt_logprobs
        for offset, row in enumerate(logits):
            nxt = start + offset + 1
            if nxt < len(ids):
                logprob, top = top_logprobs(row, ids[nxt], k)
                req.prompt_logprobs.append((logprob, token_rank(row, ids[nxt]), top))

    def _commit(self, req: Request, row: torch.Tensor, token: int) -> TokenEvent:
        event = self.output.commit(req, row, token)
        if event.finished:
            self._finish(req, event.finish_reason, row)
        return event

    def _remember(self, req: Request) -> None:
        """Snapshot the lane into the prompt cache at its current cut."""
        self.prefix_cache.insert(
            req.all_ids[: req.num_computed], req.pages, self.caches.states.snapshot(req.slot)
        )

    def abandon_all(self) -> list[TokenEvent]:
        """After a failed pass: every request still queued or running ends with finish_reason
        "error" and gives back its lane, touching no device memory (the device may be lost)."""
        self._drain_inbox()
        self._cancels.clear()
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
            self._catch_up(req)
        if req.status == Status.RUNNING and remember:
            self._remember(req)  # the end of the reply: the next chat turn resumes here
        if watch is not None and watch.on_finish is not None and req.status == Status.RUNNING:
            watch.on_finish(req, logits)
        req.finish_reason = reason
        self.drafting.release(req)
        self.scheduler.finish(req)
        self._requests.pop(req.request_id, None)
        return TokenEvent(req.request_id, [], "", finished=True, finish_reason=reason)

    def _catch_up(self, req: Request) -> None:
        """A drafting lane that ends computes the committed rows it has not, so its state, its
        prompt-cache cut and its fingerprint are a plain lane's."""
        self.drafting.settle(req)
        n = self.drafting.behind(req)
        if n:
            self.runner.execute([(req, n)])
            req.num_computed += n

    def fingerprint(self, req: Request, logits: torch.Tensor | None) -> str:
        return self.runner.fingerprint(req, logits)

    def run_until_done(self) -> None:
        while self.has_work():
            self.step()

    # -- what the server may read (any thread) ----------------------------------------------
    @property
    def facts(self) -> EngineFacts:
        cfg = self.model.config
        c = self.config
        return EngineFacts(
            cfg.vocab_size,
            c.context,
            c.parallel,
            c.max_queue,
            str(self.model.device),
            str(self.model.dtype).removeprefix("torch."),
        )

    def stats(self) -> EngineStats:
        """Queue, lanes and prompt-cache figures now (exact when read on the engine thread)."""
        running, cache = list(self.scheduler.running), self.prefix_cache
        with self._lock:
            queued = len(self._inbox) + len(self.scheduler.waiting)
        return EngineStats(
            queued=queued,
            busy_lanes=len(running),
            prompt_lanes=sum(r.in_prompt for r in running),
            passes=self._passes,
            cache_hits=cache.stats.hits,
            cache_misses=cache.stats.misses,
            cache_evictions=cache.stats.evictions,
            cache_inserts=cache.stats.inserts,
            cache_bytes=cache.nbytes,
            kv_pages_used=self.caches.kv.num_pages - self.caches.kv.free_pages,
            kv_pages_total=self.caches.kv.num_pages,
            draft_proposed=self.drafting.stats.proposed,
            draft_accepted=self.drafting.stats.accepted,
            draft_lengths=tuple(sorted(dict(self.drafting.stats.lengths).items())),
            collective_seconds=self.runner.collective.seconds,
            collective_calls=self.runner.collective.calls,
            collective_last_pass_seconds=self.runner.collective.last_pass_seconds,
        )

    def memory(self) -> MemoryReport:
        ranks = tuple(self.runner.ranks_memory())  # a split: every rank's bytes
        d = self.drafting
        in_pool = d.lanes * self.caches.states.slot_nbytes if d.fork else 0
        return memory_report(
            self.model, self.caches, self.prefix_cache, d.spare_bytes, ranks, in_pool
        )

    def close(self) -> None:
        """Lets the other ranks of a split go (a no-op for a whole model)."""
        self.runner.close()
