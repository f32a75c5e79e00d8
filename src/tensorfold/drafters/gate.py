"""When a lane drafts: its `Gate`, from the lane's own history of kept drafts and the measured
price of a verify pass against a plain one (`PassPrices`). A verify pass of 1 + k rows costs more
than a plain pass of one row (its rows, the drafter's own steps, the host's walk over them), and
more so when many lanes share the card; drafting pays only while the tokens a verify pass is
expected to commit exceed that price. The gate changes how many passes a reply takes, never its
tokens (docs/exactness.md, 'Drafting')."""

from __future__ import annotations

import math
import operator
from collections import deque
from dataclasses import dataclass, field

WORTH = 0.5  # drafts kept per verify pass below which drafting loses, while no price is measured
MARGIN = 1.05  # expected tokens per verify pass must beat its price by this much (noise)
MOST_SKIPPED = 32  # a closed gate retries after at most this many chances (more when dear)
RETRY_COST = 0.01  # priced: a closed gate's retries may cost this fraction of plain speed
FIRST_SKIP = 4  # priced: chances a gate skips when it first closes
DECAY = 0.75  # the weight of the past in each moving sum: about four verify passes
WINDOW = 8  # passes of one shape a price is the least of
PLAIN_EVERY = 4  # after the first WINDOW, an overlapped plain pass is timed one step in this many
EXPLORE = 8  # after lanes whose drafts missed, one new lane in this many starts hopeful
WAKE = 8  # chances before a closed gate's retry from which its drafter reads the target again
MOST_IDLE = 8  # a lookup that found nothing skips 1, 2, 4 ... at most this many chances
# priced: lookups that find nothing may cost this fraction of plain speed (the host's time)
LOOKUP_COST = 0.01
# a new lane's chances skipped while no plain pass is timed: a verify's price is against them
# (the first pass after a prompt waits for it, the next for a first graph's recording)
MEASURE = 3


@dataclass
class Gate:
    """Stops proposing while drafts win too little. It follows the drafts a pass keeps (`rate`,
    a moving average over about four verify passes) and the chance that a draft is kept given
    the ones before it were (`kept` / `tried`, moving sums: a pass keeping n of k drafts tried
    n + 1 of them, n when all k were kept; the start, one of one, is a hope that two misses
    undo). With a measured price (a verify pass's seconds over a plain pass's, at the lane
    count it ran at) the gate stays open while the expected tokens of a pass, 1 + a + a^2 +
    ... + a^k, beat the price by MARGIN; closed, it skips 4, 8, 16 ... chances, up to as many
    as keep its retries under RETRY_COST of plain speed. With no price: open while the last
    pass kept some and the rate is WORTH or more; closed, it skips 1, 2, 4 ... 32 chances."""

    skip: int = 0
    backoff: int = 0
    idle: int = 0  # chances skipped after the last proposal that found nothing
    rate: float = 1.0  # drafts kept per verify pass (starts hopeful)
    kept: float = 1.0
    tried: float = 1.0
    # a hopeful start against the history (LaneHistory's EXPLORE): one try, and if its drafts
    # do not pay, the history's wait at once rather than the ramp of 4, 8, 16 ... chances
    explore: bool = False

    def resting(self) -> bool:
        """Whether the lane's drafter may skip the target's states of this pass: the gate stays
        closed for more than WAKE chances, so the drafter reads the WAKE passes before a retry
        and none before them (the positions in between are unread, as after a prompt cache
        resume: the drafts may be worse, the tokens are the target's whatever they are)."""
        return self.skip > WAKE

    def open(self) -> bool:
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    @property
    def chance(self) -> float:
        """The estimated chance a draft is kept, given that the drafts before it were."""
        return min(1.0, self.kept / self.tried) if self.tried > 0 else 0.0

    def expected(self, k: int) -> float:
        """Tokens a verify pass of k drafts is expected to commit (the bonus token included)."""
        a = self.chance
        return 1.0 + sum(a**i for i in range(1, k + 1))

    def worth(self, accepted: int, drafted: int, price: float | None) -> bool:
        if price is None or drafted <= 0:
            return accepted > 0 and self.rate >= WORTH
        # a verify pass does a plain pass's work and more: a lower price is the clock's noise
        return self.expected(drafted) >= max(1.0, price) * MARGIN

    def record(self, accepted: int, drafted: int = 0, price: float | None = None) -> None:
        """After a verify pass that kept `accepted` of `drafted` drafts, at `price`."""
        self.rate += (accepted - self.rate) / 4
        self.kept = self.kept * DECAY + accepted
        self.tried = self.tried * DECAY + accepted + (accepted < drafted)
        if self.worth(accepted, drafted, price):
            self.backoff = self.skip = 0
            self.explore = self.explore and not accepted  # kept drafts: an ordinary gate
            return
        if self.explore and price is not None:  # the history was right after all
            self.explore = False
            self.backoff = self.skip = most_skipped(price)
            return
        self.defer(price)

    def found(self, proposed: bool, share: float | None = None) -> None:
        """After the drafter was asked: a lookup that found nothing (no n-gram, a prediction used
        up) skips 1, 2, 4 ... MOST_IDLE chances, so that a lane with nothing to draft lets the
        engine overlap its passes; one that proposed asks at every chance again. `share`: what
        the lanes' lookups cost against a plain step were each to look at every chance
        (PassPrices.lookup_share); then it skips at least enough that they cost LOOKUP_COST of
        plain speed (a host-bound small model pays every µs of a lookup that finds nothing)."""
        if proposed:
            self.idle = 0
            return
        least = 0 if share is None else min(256, math.ceil(share / LOOKUP_COST) - 1)
        self.idle = self.skip = max(least, min(MOST_IDLE, max(1, 2 * self.idle)))

    def defer(self, price: float | None) -> None:
        """Closes for 4, 8, 16 ... chances (1, 2, 4 ... unpriced), its record unchanged: after
        drafts that did not pay, or a proposal the pass refused (the other lanes' rows would
        cost more than its drafts win), so that an open gate never asks every pass."""
        first, most = (1, MOST_SKIPPED) if price is None else (FIRST_SKIP, most_skipped(price))
        self.backoff = self.skip = min(most, max(first, 2 * self.backoff))


@dataclass
class LaneHistory:
    """What the gates of finished lanes learnt, the start of a new lane's gate: the chance a
    draft is kept, as moving sums over lanes (each finished lane that verified counts as one
    verify pass, the start before any lane ended: a gate's hopeful one). A drafter that missed
    on the last lanes starts a new lane closed, for as long as a closed gate waits at most,
    where even the cheapest measured price is not paid (but every EXPLORE-th such lane, whose
    misses or wins teach the history again, and which, if its drafts do not pay, waits as
    long as the others at once); one that was kept starts it open."""

    kept: float = 0.0
    tried: float = 0.0
    closed_starts: int = 0  # lanes started closed; every EXPLORE-th starts hopeful instead

    def learn(self, gate: Gate) -> None:
        self.kept = self.kept * DECAY + gate.chance
        self.tried = self.tried * DECAY + 1.0

    def gate(self, k: int, price: float | None) -> Gate:
        """A new lane's gate for drafts of k tokens, `price` the cheapest measured verify price."""
        if self.tried == 0:
            return Gate()
        chance = min(1.0, self.kept / self.tried)
        gate = Gate(rate=chance * k, kept=chance, tried=1.0)
        if price is not None and not gate.worth(0, k, price):
            self.closed_starts += 1
            if self.closed_starts % EXPLORE == 0:  # replies shorter than the wait would never
                return Gate(explore=True)  # try again: a drafter that came right is found so
            # the last lanes' drafts did not pay: this lane's first try waits the longest a
            # closed gate waits, rather than paying the ramp of 4, 8, 16 ... again
            gate.backoff = gate.skip = most_skipped(price)
        return gate


@dataclass
class Lull:
    """A stretch of chances in which no lane can propose: every lane's gate is closed for them
    (none reads its prompt or has drafts in flight). Its chances are counted here, once a step,
    not lane by lane, and handed to the gates when it ends: when a lane joins or leaves, or the
    first gate is due to open or to wake its drafter (`Gate.resting`), so every gate opens and
    wakes at the chance it would have. A closed gate's step then costs the host one count."""

    lanes: list = field(default_factory=list)  # the running lanes when it began, in order
    left: int = 0  # its chances in all (0: no lull)
    owed: int = 0  # chances counted and not handed to the gates yet

    def begin(self, running: list) -> None:
        """After a chance in which no lane proposed: a lull while every gate stays closed."""
        left = 1 << 30  # lanes that never draft (no gate) close nothing
        for req in running:
            d = req.lane.draft
            if d is None:
                continue
            skip = d.gate.skip
            if d.proposal or req.in_prompt or skip <= 0:
                return
            left = min(left, skip - WAKE if skip > WAKE else skip)  # resting() holds till then
        self.lanes, self.left, self.owed = list(running), left, 0

    def holds(self, running: list) -> bool:
        """Whether this chance falls in the lull (counted); False once it ended."""
        if not self.left:
            return False
        if not self.same(running):
            self.end()
            return False
        self.owed += 1
        if self.owed == self.left:
            self.end()
        return True

    def same(self, running: list) -> bool:
        return len(running) == len(self.lanes) and all(map(operator.is_, running, self.lanes))

    def end(self) -> None:
        """Hands the chances counted to the gates."""
        for req in self.lanes:
            d = req.lane.draft
            if d is not None:
                d.gate.skip -= self.owed
        self.lanes, self.left, self.owed = [], 0, 0


def most_skipped(price: float) -> int:
    """The longest a closed gate waits at this price: a retry costs price - 1 plain passes."""
    return max(MOST_SKIPPED, min(256, int((max(1.0, price) - 1.0) / RETRY_COST)))


def verify_pays(expected: list[float], riders: int, price: float | None) -> bool:
    """Whether a pass in which drafting lanes (`expected`: the tokens each expects to commit)
    and `riders` lanes with nothing to draft (one token each) all feed verify rows beats a plain
    pass of the same lanes, at `price` (verify seconds over plain). Unmeasured: yes, which
    measures it."""
    if price is None:
        return True
    lanes = len(expected) + riders
    return sum(expected) + riders >= max(1.0, price) * lanes * MARGIN


def lane_bucket(lanes: int) -> int:
    """Lane counts whose passes are priced together (powers of two: a price changes slowly)."""
    return 1 << max(0, lanes - 1).bit_length()


@dataclass
class PassPrices:
    """Measured seconds of the engine's passes by (lane bucket, rows per lane): the least of the
    last WINDOW passes in which every lane fed that many rows and none read its prompt (the
    engine records each; passes of other shapes are not priced). The least, because a pass's
    time only ever gains from outside it: a first pass of a shape that compiles or records a
    CUDA graph, a host hiccup; a moving average would carry such a pass for long."""

    seconds: dict[tuple[int, int], deque[float]] = field(default_factory=dict)
    plain_steps: int = 0  # plain steps that could have been timed
    # a lane's lookup at a chance (its drafter's proposal on the host), the least of the last
    lookups: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def wants_plain(self) -> bool:
        """Whether this plain step is timed: each of the first WINDOW, then one in
        PLAIN_EVERY (a window of 8 then spans 32 steps). A step not timed costs the host none
        of the pricing's work, which a host-bound step would pay in full."""
        self.plain_steps += 1
        return self.plain_steps <= WINDOW or self.plain_steps % PLAIN_EVERY == 0

    def record(self, lanes: int, rows: int, seconds: float) -> None:
        key = (lane_bucket(lanes), rows)
        kept = self.seconds.get(key)
        if kept is None:  # made once: a plain step records a pass every step
            kept = self.seconds[key] = deque(maxlen=WINDOW)
        kept.append(seconds)

    def plain_measured(self) -> bool:
        """Whether two plain passes were timed at some lane count (the first after a prompt
        waits for the prompt's pass: one is not enough). Until then a new lane's gate skips
        its first MEASURE chances: a lane whose drafts keep winning a little never lets the
        engine time a plain pass, and unpriced it would draft on at any cost."""
        return any(rows == 1 and len(v) >= 2 for (_, rows), v in self.seconds.items())

    def ratio(self, lanes: int, rows: int) -> float | None:
        """A pass of `rows` rows a lane over a plain one at this lane count; None until both
        were measured."""
        b = lane_bucket(lanes)
        verify, plain = self.seconds.get((b, rows)), self.seconds.get((b, 1))
        if not verify or not plain or min(plain) <= 0:
            return None
        return min(verify) / min(plain)

    def lookup_share(self, lanes: int) -> float | None:
        """What `lanes` lanes looking up at every chance would cost over a plain pass of that
        many lanes (their host time a step against the step's); None until both were timed."""
        plain = self.seconds.get((lane_bucket(lanes), 1))
        if not self.lookups or not plain or min(plain) <= 0:
            return None
        return lanes * min(self.lookups) / min(plain)

    def cheapest(self, rows: int) -> float | None:
        """The least price of a pass of `rows` rows a lane at any lane count measured."""
        found = [self.ratio(b, rows) for b, r in self.seconds if r == rows]
        return min((f for f in found if f is not None), default=None)
