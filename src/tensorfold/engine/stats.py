"""What the engine tells the server: fixed facts, live figures and memory by owner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..cache import ModelCaches
from ..cache.prefix_cache import PrefixCache
from ..util import rss_bytes

if TYPE_CHECKING:  # the engine takes any loaded model; only the type is named
    from ..models.qwen3_5 import Qwen35Model


@dataclass(frozen=True)
class EngineFacts:
    """What does not change while the engine runs."""

    vocab_size: int
    context: int  # prompt + max_tokens may not exceed it
    lanes: int  # requests served at once (--parallel)
    max_queue: int  # requests that may wait for a lane
    device: str
    dtype: str

    @classmethod
    def of(cls, model: Qwen35Model, config) -> EngineFacts:
        """From the model and the engine's config."""
        dtype = str(model.dtype).removeprefix("torch.")
        vocab, c = model.config.vocab_size, config
        return cls(vocab, c.context, c.parallel, c.max_queue, str(model.device), dtype)


@dataclass(frozen=True)
class EngineStats:
    """The queue, the lanes and the prompt cache at one moment."""

    queued: int = 0  # requests waiting for a lane
    busy_lanes: int = 0
    prompt_lanes: int = 0  # busy lanes still reading their prompt
    passes: int = 0  # forward passes run so far
    cache_hits: int = 0  # admissions that resumed from the prompt cache
    cache_misses: int = 0  # admissions that found no cached prefix
    cache_evictions: int = 0
    cache_inserts: int = 0
    cache_bytes: int = 0
    kv_pages_used: int = 0  # KV pages held by lanes and the prompt cache
    kv_pages_total: int = 0
    draft_proposed: int = 0  # drafted tokens scored by verify passes
    draft_accepted: int = 0  # of them, the ones the target chose too
    draft_lengths: tuple[tuple[int, int], ...] = ()  # (tokens committed, verify passes), sorted
    collective_seconds: float = 0.0  # a tensor split: time in all-gathers and plans, in total
    collective_calls: int = 0
    collective_last_pass_seconds: float = 0.0


@dataclass(frozen=True)
class MemoryReport:
    """Bytes by owner. The KV pool includes the pages the prompt cache may hold."""

    device: str
    weights_bytes: int
    kv_pool_bytes: int
    state_pool_bytes: int
    draft_state_bytes: int  # the lanes' spare GDN state slots for verify passes (per position)
    prompt_cache_bytes: int
    prompt_cache_budget_bytes: int
    prompt_cache_entries: int
    process_rss_bytes: int
    device_allocated_bytes: int | None  # None off CUDA
    device_peak_bytes: int | None
    ranks: tuple = ()  # a tensor split: every rank's bytes (runner/distributed.py RankMemory)
    unpacked_bytes: int = 0  # packed weights held dequantized too (--unpacked-weights)
    # whole --context spans the KV pool holds; fewer than --parallel: the lanes share its pages
    kv_contexts: int = 0


def engine_stats(
    queued: int, running: list, passes: int, cache: PrefixCache, kv, drafts, collective
) -> EngineStats:
    """The figures of the lanes `running`, the prompt cache, the KV pool `kv`, drafting's
    `drafts` (DraftStats) and a split's `collective` time."""
    return EngineStats(
        queued=queued,
        busy_lanes=len(running),
        prompt_lanes=sum(r.in_prompt for r in running),
        passes=passes,
        cache_hits=cache.stats.hits,
        cache_misses=cache.stats.misses,
        cache_evictions=cache.stats.evictions,
        cache_inserts=cache.stats.inserts,
        cache_bytes=cache.nbytes,
        kv_pages_used=kv.num_pages - kv.free_pages,
        kv_pages_total=kv.num_pages,
        draft_proposed=drafts.proposed,
        draft_accepted=drafts.accepted,
        draft_lengths=tuple(sorted(dict(drafts.lengths).items())),
        collective_seconds=collective.seconds,
        collective_calls=collective.calls,
        collective_last_pass_seconds=collective.last_pass_seconds,
    )


def memory_report(
    model: Qwen35Model,
    caches: ModelCaches,
    cache: PrefixCache,
    draft_bytes: int = 0,
    ranks: tuple = (),
    spares_in_pool: int = 0,
    kv_contexts: int = 0,
) -> MemoryReport:
    """`spares_in_pool`: bytes of the state pool that are drafting's spare slots (counted in
    draft_bytes, not as the lanes' state)."""
    device = model.device
    on_cuda = device.type == "cuda"
    return MemoryReport(
        device=str(device),
        weights_bytes=model.weight_bytes,
        kv_pool_bytes=caches.kv.nbytes,
        state_pool_bytes=caches.states.nbytes - spares_in_pool,
        draft_state_bytes=draft_bytes,
        prompt_cache_bytes=cache.nbytes,
        prompt_cache_budget_bytes=cache.budget_bytes,
        prompt_cache_entries=len(cache),
        process_rss_bytes=rss_bytes(),
        device_allocated_bytes=torch.cuda.memory_allocated(device) if on_cuda else None,
        device_peak_bytes=torch.cuda.max_memory_allocated(device) if on_cuda else None,
        ranks=ranks,
        unpacked_bytes=model.unpacked_bytes(),
        kv_contexts=kv_contexts,
    )
