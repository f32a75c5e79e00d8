"""Exact speculative decoding around the engine's pass: a lane proposes k tokens, the target
scores them in one pass, and only the tokens the target itself would have chosen are kept.
docs/exactness.md ('Drafting') has the argument; in short:

- a verify segment is the lane's uncomputed committed rows, then its drafts, computed with any
  row's arithmetic; row j's logits choose its token by the request's own rule, and the drafts
  stand while they equal those choices (the first miss is the bonus token);
- the lane's GDN state before the pass is kept: the pass reads it from the lane's slot and
  leaves the state after its rows in the lane's spare slot, which becomes the lane's slot when
  every fed row is committed; after a miss the lane keeps its slot and the committed rows after
  it are recomputed at the head of the next pass (where the pass's kernels cannot write another
  slot, the chunk forms', the state is copied to the spare before and put back after a miss);
- a lane with several committed rows to recompute may fork instead: its state is copied to the
  spare and the pass feeds those rows to it too, so a missing lane stays one verify behind
  (never a pile-up of rows); passes aligned to CUDA graphs make no fork, which would make them
  eager.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..cache import StatePool
from ..drafters.base import LaneDraft, LaneDrafter, take_read, unread
from ..drafters.choice import DraftConfig, refuse_split_draft
from ..drafters.gate import MEASURE, LaneHistory, Lull, PassPrices, verify_pays
from ..drafters.lookup import PredictionDrafter, make_drafter
from ..errors import SplitRefused
from ..runner.plan import LaneRows, PassPlan
from .request import Request, TokenEvent

# what a pass needs of drafting before the engine may overlap it (Drafting.stillness)
BUSY, ASKS, QUIET = "busy", "asks", "quiet"


@dataclass
class DraftStats:
    """Engine-wide figures: proposed and accepted tokens, and tokens committed per verify pass."""

    proposed: int = 0
    accepted: int = 0
    verifies: int = 0
    lengths: dict[int, int] = field(default_factory=dict)  # tokens committed -> verify passes

    @property
    def acceptance_length(self) -> float:
        """Mean tokens committed per verify pass (accepted drafts and the bonus token)."""
        return sum(n * c for n, c in self.lengths.items()) / max(1, self.verifies)

    def record(self, proposed: int, accepted: int, committed: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.verifies += 1
        self.lengths[committed] = self.lengths.get(committed, 0) + 1


class Drafting:
    """The engine's drafting: proposes before a pass, verifies after it, settles state."""

    def __init__(
        self,
        config: DraftConfig,
        caches,
        lanes: int,
        target=None,
        allowed: bool = True,
        writes: bool = False,
        weights=None,
    ) -> None:
        """`allowed` False (a tensor split, whose other ranks do not keep spare state slots):
        nothing drafts, a request's `prediction` included; its tokens are the same either way.
        `writes`: the pass's kernels can leave a lane's state in another slot than the one they
        read (the per-token recurrence's: LaneIndex.writes). `weights`: the drafter's, read
        before the pools (drafters.lookup.load_drafter)."""
        if config.method and not allowed:
            raise SplitRefused(refuse_split_draft())
        self.config, self.states, self.lanes = config, caches.states, lanes
        self.allowed = allowed
        # the engine's pool has a spare slot per lane when a drafter is configured: forks
        self.fork = self.states.num_slots >= 2 * lanes
        self.spares: StatePool | None = self.states if self.fork else None  # else made on use
        self.writes = writes
        self.default = (
            make_drafter(config.method, target, caches, weights) if config.method else None
        )
        self.align = False  # every verify pass 1 + k rows per lane: one CUDA graph's shape
        self.stats = DraftStats()
        self.prices = PassPrices()  # the engine's measured passes: what a verify costs the gate
        # a lane may draft (a drafter, or a request's prediction once one came): the engine
        # times its passes only then, a plain engine's steps do none of it
        self.priced = self.default is not None
        self.history = LaneHistory()  # what finished lanes' gates learnt: a new gate's start
        self.lull = Lull()  # chances in which every gate stays closed, counted once a step

    def lane(self, req: Request, enabled: bool, prediction: list[int] | None) -> LaneDraft | None:
        """The request's drafting, or None when it drafts nothing (watched for every row's
        logits: those are a plain pass's rows)."""
        watched = req.watch is not None and req.watch.keep_logits
        drafters: list[LaneDrafter] = []
        if prediction:
            drafters.append(PredictionDrafter(tuple(prediction)))
        if self.default is not None:
            drafters.append(self.default.for_request(req))
        if not enabled or watched or not drafters or not self.allowed:
            return None
        self.priced = True
        if prediction:  # the client's own guess: hopeful, whatever the drafter did before
            return LaneDraft(tuple(drafters))
        k = self.config.tokens
        draft = LaneDraft(tuple(drafters), self.history.gate(k, self.prices.cheapest(k + 1)))
        if not self.prices.plain_measured():  # the passes a verify's price is against, first
            draft.gate.skip = max(draft.gate.skip, MEASURE)
        return draft

    def propose(self, running: list[Request]) -> None:
        """Each generating lane with nothing in flight proposes up to k tokens it may commit;
        aligned, fewer by the committed rows it recomputes after a rejection, and a shorter
        proposal padded with its last token, so that its pass stays 1 + k rows
        (runner/cuda_graph.py): a padded token is a guess like any draft."""
        if self.lull.holds(running):  # every gate closed at this chance too
            return
        self._ask(running)
        self.lull.begin(running)  # when no lane proposed and every gate stays closed a while

    def _ask(self, running: list[Request]) -> None:
        ready = []
        for req in running:
            d = req.lane.draft
            if d is None or d.proposal or req.in_prompt or not d.gate.open():
                continue  # a closed gate's chance is counted by open()
            room = self.room(req)
            if room > 0:
                ready.append((req, room))
        if not ready:  # chances counted, nothing to propose (the usual step)
            return
        ride = self.align and self.can_ride(running)  # proposing changes no lane's room
        if ride and 0 < len(ready) < len(running):
            expected = [req.lane.draft.gate.expected(room) for req, room in ready]
            if not self.pays(running, expected):  # they would not pay for the others' rows
                self.defer([req for req, _ in ready], len(running))
                return
        asks = []  # lanes the engine's drafter proposes for, all in one call
        # lookups on the host, timed with their bookkeeping (the MTP head's steps are priced in
        # its verify pass); only at a chance: a step with no lane asking times nothing
        looked, start = 0, time.perf_counter()
        for req, room in ready:
            d = req.lane.draft
            unread = req.lane.pending >= 0  # its last token on the device: its drafters guess it
            for drafter in d.drafters:
                if unread:
                    if not drafter.guesses:  # stillness read the token of any lane that asks
                        continue
                    found = drafter.guess(req.all_ids, req.output_ids, room)
                elif self.default is not None and drafter is d.drafters[-1]:
                    asks.append((req, room))
                    break
                else:
                    found = drafter.propose(req.all_ids, req.output_ids, room)
                looked += 1
                d.take(found, room)
                if d.proposal:
                    d.source = drafter
                    break
        # what the lanes' lookups cost a plain step, at the chances timed before (Gate.found)
        share = self.prices.lookup_share(len(running)) if looked else None
        if asks:
            many = [(r.lane.draft.drafters[-1], r.all_ids, r.output_ids, n) for r, n in asks]
            for (req, room), proposal in zip(asks, self.default.propose_many(many)):
                d = req.lane.draft
                d.take(proposal, room)
                d.source = d.drafters[-1] if d.proposal else None
        for req, room in ready:
            d = req.lane.draft
            d.real = len(d.proposal)
            d.gate.found(d.real > 0, share)
            if self.align:  # a short proposal padded: its pass stays a graph's
                d.pad(room)
        if ride:
            self.share_pass(running)
        if looked:  # a chance's host time a lookup (Gate.found)
            self.prices.lookups.append((time.perf_counter() - start) / looked)

    def share_pass(self, running: list[Request]) -> None:
        """An aligned pass replays a graph only when every lane feeds the same rows. When some
        lanes draft and others do not (a closed gate, no match), the others ride along with
        their last token repeated as drafts (a guess like any: the walk commits what a plain
        pass would) if the drafts' expected tokens pay for every lane's verify rows at the
        measured price; else no lane drafts this pass."""
        drafting = [r for r in running if r.drafting]
        if not drafting or len(drafting) == len(running):
            return
        if self.pays(running, [r.lane.draft.gate.expected(r.lane.draft.real) for r in drafting]):
            for r in running:
                if not r.drafting:
                    last = r.output_ids[-1:] or r.prompt_ids[-1:]  # not the whole list
                    r.lane.draft.take(last * self.room(r), self.room(r))
                    r.lane.draft.real, r.lane.draft.source = 0, None
        else:
            for r in drafting:
                r.lane.draft.drop()
                r.lane.draft.real, r.lane.draft.source = 0, None
            self.defer(drafting, len(running))

    def defer(self, refused: list[Request], lanes: int) -> None:
        """Lanes whose proposals a pass of `lanes` refused wait before they ask again (else an
        open gate asks, and keeps the engine from overlapping, every pass)."""
        price = self.prices.ratio(lanes, self.config.tokens + 1)
        for req in refused:
            req.lane.draft.gate.defer(price)

    def pays(self, running: list[Request], expected: list[float]) -> bool:
        """Whether drafting lanes (`expected`: the tokens each expects to commit) with the
        other lanes riding beat a plain pass, at the measured price of this lane count."""
        price = self.prices.ratio(len(running), self.config.tokens + 1)
        return verify_pays(expected, len(running) - len(expected), price)

    def can_ride(self, running: list[Request]) -> bool:
        """Every lane of an aligned pass could feed 1 + K rows: none reads its prompt, none is
        near its end, each has a drafting state (else the pass is mixed, eager, anyway)."""
        full = self.config.tokens
        return all(
            not r.in_prompt
            and r.lane.draft is not None
            and self.room(r) + self.recompute(r) == full
            for r in running
        )

    def recompute(self, req: Request) -> int:
        """Committed rows an aligned lane feeds again after a rejection."""
        return req.num_tokens - req.lane.computed - 1

    def stillness(self, lanes: list[Request]) -> str:
        """Whether a pass of `lanes` needs drafting to wait for the host to know the last
        tokens: BUSY when a lane has drafts in flight; else ASKS when a drafting lane proposes
        at this chance (`propose` only counts a closed gate's chance); else QUIET, and the
        engine may overlap the pass. A lane whose verify missed has its committed rows read
        again: their tokens are on the host, so that pass overlaps as any other. A closed
        gate's drafter may still read the target's states of an overlapped pass: `observe`
        after the pass's tokens are chosen on the device."""
        if self.lull.left and self.lull.same(lanes):  # no proposal, every gate closed
            return QUIET
        mode = QUIET
        for req in lanes:
            d = req.lane.draft
            if d is None:
                continue
            if d.proposal:
                return BUSY
            if self.asks(req):
                mode = ASKS
        return mode

    def asks(self, req: Request) -> bool:
        """Whether the lane's chance needs its last token read first (as `propose` decides):
        its gate open, its prompt read, room for a draft, that token still on the device, and
        a drafter that must see it (drafters that `guess` it take the chance overlapped). A
        lane reading its prompt or at its end asks nothing."""
        d = req.lane.draft
        if d.gate.skip > 0 or req.in_prompt or self.room(req) <= 0:
            return False
        return req.lane.pending >= 0 and not all(dr.guesses for dr in d.drafters)

    @property
    def flip(self) -> bool:
        """A verify pass writes each lane's spare (no copy before it, none after a miss): the
        kernels must write another slot, and the spare be one of the pool they index."""
        return self.writes and self.spares is self.states

    def room(self, req: Request) -> int:
        """Drafts a drafting lane may carry in its next pass. Aligned: fewer by the rows it
        recomputes, and near its end as many as its KV rows reach (the scheduler's lookahead):
        drafts past its last token cost nothing in a graph's pass, the walk stops at the end.
        Eager: none past its last token."""
        if not self.align:  # a token on the device, unread, is the reply's too
            made = req.num_tokens - len(req.prompt_ids)
            return min(self.config.tokens, req.max_tokens - made - 1)
        reach = req.lane.kv_rows.shape[0] - req.num_tokens  # positions num_tokens.. it may fill
        return min(self.config.tokens - self.recompute(req), reach)

    def before_pass(self, work) -> tuple[LaneRows, ...]:
        """Each drafting lane keeps the drafts its rows fit, and its state is copied to its
        spare slot (one copy per state tensor for all lanes); returns the forks to feed with
        the pass: a lane's committed rows again, into its spare slot, returning no logits."""
        src, dst, forks = [], [], []
        for w in work:
            req, lane = w.request, w.request.lane
            d = lane.draft
            lane.writes = -1
            if not req.drafting:
                continue
            pending = req.num_tokens - lane.computed
            d.cut(max(0, w.rows - pending))
            if not d.proposal:
                continue
            if self.spares is None:
                self.spares = self.states.like(self.lanes)
            if d.spare < 0:
                d.spare = self.spares.allocate()
            d.start = lane.computed
            # aligned passes (CUDA graphs) stay 1 + K rows a lane: a fork's segment would make
            # the pass eager, which costs far more on a GPU than the rows it saves
            d.forked = pending if self.fork and not self.align and pending > 1 else 0
            if self.flip and not d.forked:
                lane.writes = d.spare  # the pass leaves its state there, its own slot untouched
                continue
            src.append(lane.slot)
            dst.append(d.spare)
            if d.forked:
                ids = tuple(req.all_ids[d.start : d.start + pending])
                key = f"{req.request_id} fork"
                forks.append(LaneRows(key, d.spare, d.start, ids, lane.kv_rows, tuple(lane.pages)))
        if src:
            self.states.copy_slots(src, dst, into=self.spares)
        return tuple(forks)

    def after_pass(self, work, logits, sampler, output) -> dict[int, list[TokenEvent]]:
        """Verifies each drafting lane of the pass: {index in work: the events of the tokens it
        committed}. The engine finishes a lane whose last event says it ended."""
        lanes = [i for i, w in enumerate(work) if w.request.drafting]
        drafts = [work[i].request.lane.draft for i in lanes]
        # a draft left on the device holds its place (PENDING): its rows are known
        rows = [(work[i].request, logits[i][: len(d.proposal) + 1]) for i, d in zip(lanes, drafts)]
        picks, ids = sampler.greedy_picks(rows, along=unread(drafts))  # one copy back
        take_read(drafts, ids)
        restores = []
        done = {}
        for i, p in zip(lanes, picks):
            price = self.prices.ratio(len(work), work[i].rows)
            done[i] = self.verify(work[i].request, logits[i], sampler, output, price, p, restores)
        self.put_back(restores)
        return done

    @staticmethod
    def shape(work) -> tuple[int, int] | None:
        """(lanes, rows a lane) of a pass in which every lane generates and feeds the same rows:
        the passes whose time the engine records in `prices`; None for any other."""
        rows = work[0].rows
        for w in work:  # every step asks: a plain loop, no sets
            if w.rows != rows or w.request.in_prompt:
                return None
        return len(work), rows

    def verify(
        self, req: Request, logits, sampler, output, price, picks, restores
    ) -> list[TokenEvent]:
        """Commits the accepted drafts and the bonus token, one at a time through the plain
        path (each choice sees the tokens before it), then settles the lane's state; the gate
        hears how many were kept at what price (a pass of this shape over a plain one). The
        engine finishes the request when the last event says it ended. `picks`: the rows'
        greedy choices read already (Sampler.greedy_picks), [] to choose row by row;
        `restores`: where the lane's (spare, slot) goes when its saved state is to be put back."""
        d, events = req.lane.draft, []
        proposal, k = d.proposal, len(d.proposal)
        req.lane.computed = req.num_tokens + k  # the state covers every fed row for now
        accepted = 0
        lazy = output.defers_text(req)  # the run's text decoded once, at its end
        for j in range(k + 1):
            token = picks[j] if picks else sampler.choose_token(req, logits[j])
            event = output.commit(req, logits[j], token, text=not lazy)
            events.append(event)
            if j < k and accepts(proposal[j], token):
                accepted += 1
            if event.finished or j == k or not accepts(proposal[j], token):
                break
        if lazy and not events[-1].finished:  # a finishing token decoded the whole run
            output.flush(req, events[-1])
        if d.source is not None:  # a rider's repeated token is no drafter's: nothing to hear
            d.proposed, d.accepted = d.proposed + k, d.accepted + accepted
            d.gate.record(accepted, k, price)
            self.stats.record(k, accepted, len(events))
        if isinstance(d.source, PredictionDrafter):  # the prediction's own tokens only
            real = min(k, d.real)
            d.prediction_accepted += min(accepted, real)
            d.prediction_rejected += real - min(accepted, real)
        if not events[-1].finished:
            self.settle(req, restores)
        return events

    def settle(self, req: Request, restores: list) -> None:
        """After a verify: keep the state if every fed row's input was committed (a pass that
        wrote the spare makes it the lane's slot), else go back to the state before the pass: the
        lane's own slot where the pass wrote the spare, or the copy to put back (with a fork: the
        state after the rows committed before the pass; its (spare, slot) left in `restores` for
        `put_back`), so the lane's next pass computes the committed rows after it again."""
        lane = req.lane
        d = lane.draft
        if d is None:
            return
        # a pass not walked (the lane ended on the token read while it ran) keeps no row
        walked = lane.computed != d.start
        kept = walked and lane.computed == req.num_tokens - 1
        if lane.writes >= 0:  # the pass left the state in the spare: the lane's if it stands
            if kept:
                lane.slot, d.spare = d.spare, lane.slot
            else:
                lane.computed = d.start
            lane.writes = -1
        elif d.start >= 0 and not kept:
            restores.append((d.spare, lane.slot))
            lane.computed = d.start + d.forked
        d.start = -1
        d.drop()

    def use_graphs(self, context: int) -> None:
        """The runner replays passes from CUDA graphs: verify passes are aligned to them, and a
        drafter with steps of its own (the MTP head) records those too."""
        self.align = True
        if self.default is not None:
            self.default.use_graphs(context, self.config.tokens)

    @property
    def wants_hidden(self) -> bool:
        """The drafter reads the target's states after each pass (mtp, dflash)."""
        return self.default is not None and self.default.reads_states

    def features(self, target):
        return self.default.features(target) if self.wants_hidden else None

    def observe(self, work, plan, hidden) -> bool:
        """After a pass: each drafting lane's rows of the target's post-final-norm states, for a
        drafter that reads them (`plan` lists the scheduled lanes first, in `work`'s order).
        A drafter that holds them past the pass gets copies (the next pass overwrites a graph's
        output): of a generating pass, one copy for all lanes (one launch, not one a lane); of
        a pass with prompt rows, one a lane, so that a lane's few held rows never keep a whole
        prompt chunk's copy alive. A lane whose closed gate rests (`Gate.resting`) reads nothing:
        a drafter that cannot win costs no copy, head rows or catch-up while it waits. Returns
        whether a lane read (False: every gate rests, and no verify pass is near)."""
        reads, row0 = [], 0  # (lane draft, first row, plan rows) of the lanes that read
        for w, rows in zip(work, plan):
            d = w.request.lane.draft
            if d is not None and w.request.lane.slot >= 0 and not d.gate.resting():
                reads.append((d, row0, rows))
            row0 += rows.rows
        if not reads:  # every gate rests: no copy, no drafter work
            return False
        total = row0  # the scheduled lanes' rows come first in the plan
        holds = self.default.holds_states
        shared = holds and total <= len(work) * (self.config.tokens + 1)
        if shared:
            hidden = hidden[:total].clone()
        for d, row0, rows in reads:
            part = hidden[row0 : row0 + rows.rows]
            part = part.clone() if holds and not shared else part
            for drafter in d.drafters:
                drafter.observe(rows.start, part)
        return True

    def put_back(self, restores: list[tuple[int, int]]) -> None:
        """The saved states of the lanes `settle` named copied back, in one call for all."""
        if restores:
            self.spares.copy_slots(*map(list, zip(*restores)), into=self.states)

    def catch_up(self, req: Request, runner) -> None:
        """A drafting lane that ends computes the committed rows it has not (one pass of its
        own), so its state, its prompt-cache cut and its fingerprint are a plain lane's."""
        restores = []
        self.settle(req, restores)
        self.put_back(restores)
        n = self.behind(req)
        if n:
            runner.execute(PassPlan((req.rows(n),)))
            req.lane.computed += n

    def behind(self, req: Request) -> int:
        """Committed rows a finishing lane has not computed (a plain lane has none)."""
        if req.lane.draft is None or req.in_prompt:
            return 0
        return max(0, req.num_tokens - 1 - req.lane.computed)

    def release(self, req: Request) -> None:
        """An ended lane: its gate's record learnt, its spare slot freed, and a proposal still
        in flight dropped (the pass that carries it is not walked for the lane)."""
        d = req.lane.draft
        if d is None:
            return
        d.drop()
        if d.proposed and not isinstance(d.drafters[0], PredictionDrafter):
            self.history.learn(d.gate)  # the drafter's record, not a client's guess
        if d.spare >= 0:
            self.spares.release(d.spare)
            d.spare = -1

    @property
    def spare_bytes(self) -> int:
        """Memory kept for drafting: one spare state slot per lane (once any lane drafted) and a
        drafter's own cache (the MTP head's KV rows)."""
        own = self.default.nbytes if self.default is not None else 0
        if self.fork:
            return own + self.lanes * self.states.slot_nbytes
        return own + (self.spares.nbytes if self.spares is not None else 0)


def accepts(drafted: int, chosen: int) -> bool:
    """A drafted token stands iff it is the token the target chose at its position."""
    return drafted == chosen


__all__ = ["Drafting", "accepts"]
