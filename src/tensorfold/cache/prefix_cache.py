"""The prompt cache: prefixes keyed by their token ids, each holding what a lane needs to resume
exactly at its cut: the KV pages of positions [0, cut) (shared, copy-on-write for the last
partial page) and a snapshot of every Gated DeltaNet conv and recurrent state at the cut.

Keys are hash chains over whole KV pages; entries are bucketed by the chain hash of their last
whole page and checked token by token, so a hash collision can never resume the wrong prefix.
Eviction is least-recently-used by bytes. It never disturbs a running lane: a lane that
resumed holds its own references to the pages it reads.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

from .kv_pool import KVPool
from .state_pool import StateSnapshot


def chain_hashes(tokens: list[int], page_size: int, upto: int) -> list[bytes]:
    """h[k] = hash of tokens[0 : k*page_size], for k = 0 .. upto // page_size."""
    hashes = [b""]
    for k in range(upto // page_size):
        chunk = ",".join(map(str, tokens[k * page_size : (k + 1) * page_size])).encode()
        hashes.append(hashlib.sha256(hashes[-1] + chunk).digest())
    return hashes


@dataclass
class CacheEntry:
    tokens: tuple[int, ...]
    pages: list[int]  # pages of positions [0, cut), the last maybe partial
    snapshot: StateSnapshot
    nbytes: int
    last_used: int = 0

    @property
    def cut(self) -> int:
        return len(self.tokens)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    inserts: int = 0
    hit_tokens: int = 0


@dataclass
class PrefixCache:
    kv: KVPool
    budget_bytes: int
    entries: dict[bytes, list[CacheEntry]] = field(default_factory=dict)
    stats: CacheStats = field(default_factory=CacheStats)
    nbytes: int = 0
    _clock: itertools.count = field(default_factory=itertools.count)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return sum(len(v) for v in list(self.entries.values()))  # one copy: /memory reads it live

    def lookup(self, tokens: list[int]) -> CacheEntry | None:
        """The longest cached cut that is a prefix of `tokens` and leaves at least one to compute.
        Changes only the entry's recency; `record` counts the outcome once the request is admitted."""
        if not self.enabled:
            return None
        limit = len(tokens) - 1
        hashes = chain_hashes(tokens, self.kv.page_size, limit)
        for k in range(len(hashes) - 1, -1, -1):
            best = None
            for e in self.entries.get(hashes[k], ()):
                if (
                    e.cut <= limit
                    and (best is None or e.cut > best.cut)
                    and tuple(tokens[: e.cut]) == e.tokens
                ):
                    best = e
            if best is not None:
                best.last_used = next(self._clock)
                return best
        return None

    def record(self, entry: CacheEntry | None) -> None:
        """Counts an admitted request's lookup: a hit of entry.cut tokens, or a miss."""
        if not self.enabled:
            return
        if entry is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
            self.stats.hit_tokens += entry.cut

    def insert(self, tokens: list[int], pages: list[int], snapshot: StateSnapshot) -> bool:
        """Keeps the prefix `tokens` (cut = len(tokens)); pages are shared, not copied."""
        if not self.enabled or not tokens:
            return False
        key = chain_hashes(tokens, self.kv.page_size, len(tokens))[-1]
        if any(e.tokens == tuple(tokens) for e in self.entries.get(key, ())):
            return False
        n_pages = self.kv.pages_for(len(tokens))
        size = n_pages * self.kv.page_bytes + snapshot.nbytes
        if size > self.budget_bytes:
            return False
        self.make_room(size)
        entry = CacheEntry(
            tuple(tokens), self.kv.share(pages[:n_pages]), snapshot, size, next(self._clock)
        )
        self.entries.setdefault(key, []).append(entry)
        self.nbytes += size
        self.stats.inserts += 1
        return True

    def make_room(self, size: int = 0, pages: int = 0) -> None:
        """Evicts least-recently-used entries until `size` more bytes fit the budget and `pages`
        pages are free in the pool (or nothing is left to evict)."""
        while self.entries and (
            self.nbytes + size > self.budget_bytes or self.kv.free_pages < pages
        ):
            key, entry = min(
                ((k, e) for k, es in self.entries.items() for e in es),
                key=lambda ke: ke[1].last_used,
            )
            self._remove(key, entry)

    def _remove(self, key: bytes, entry: CacheEntry) -> None:
        self.entries[key].remove(entry)
        if not self.entries[key]:
            del self.entries[key]
        self.kv.release(entry.pages)
        self.nbytes -= entry.nbytes
        self.stats.evictions += 1

    def clear(self) -> None:
        for key in list(self.entries):
            for entry in list(self.entries.get(key, ())):
                self._remove(key, entry)
