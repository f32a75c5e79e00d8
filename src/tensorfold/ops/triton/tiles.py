"""The reduction plan of a GPU product (from the weight's shape alone) and its launch shapes:
the candidates per rows class, and the tile book that times them once on the card. Only speed
follows a launch shape; the registry checks that every candidate gives the default's bytes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from ...util import capturing

SEGMENT = 1024  # K columns per segment when K is a larger multiple of it
SPLIT_MAX_ROWS = 128  # at most this many rows use the split form (unless a shape asks `whole`)
# few packed rows, weights on the MMA's wide side: (columns, warps, stages, plan blocks a step);
# four 64-column blocks a step read 128 bytes of a 4-bit weight row per load
SWAPPED = ((64, 4, 3, 4), (128, 4, 3, 4), (128, 8, 3, 4), (64, 4, 4, 2), (128, 4, 4, 2))
# 17-64 packed rows (many decoding lanes), weights on the wide side: (rows, columns, warps, blocks)
MIDDLE_SWAPPED = ((64, 64, 4, 2), (64, 128, 8, 2), (32, 128, 4, 2))
# 65-512 packed rows may run the Gluon swapped kernel on pieces of 64 or 128 rows (its tile's
# rows), one after another (each row's sums its own, so the same bits; the weight read once a
# piece; at 256 rows a tile ptxas spills). Offered to 128 rows (25-35% faster than the Triton
# forms at 80 and 128 rows on the card); past that, timed only by benchmarks
PIECE_ROWS = (64, 128)
PIECES_MAX_ROWS = 512


@dataclass(frozen=True)
class LinearPlan:
    segment: int  # K columns summed from zero before joining the running sum
    block_k: int  # K columns per tl.dot step

    @staticmethod
    def for_weight(n: int, k: int, group_size: int | None = None) -> "LinearPlan":
        """The reduction plan from the matrix's shape alone (and its quantization group: a K block
        never spans two scale groups, so each block's scales are one column)."""
        if k % 16:
            raise ValueError(f"GPU products need an input width divisible by 16, got K={k}")
        segment = SEGMENT if k > SEGMENT and k % SEGMENT == 0 else k
        block = next(b for b in (128, 64, 32, 16) if segment % b == 0)
        if group_size is not None:  # unpacked tiles are larger: 64 columns at most
            block = min(block, group_size, 64)
        return LinearPlan(segment=segment, block_k=block)

    def segments(self, k: int) -> int:
        return k // self.segment


@dataclass(frozen=True)
class Tiles:
    """A launch shape: never part of the arithmetic (the registry checks rows across them)."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    wide: int = 1  # packed weights: plan K blocks dequantized and fed to one tl.dot per step
    whole: bool = (
        False  # few rows in the whole form too (same bits as the split form, no second kernel)
    )
    dequant: bool = (
        False  # packed weights, many rows: dequantized to bf16 once, then the dense kernel
    )
    swap: bool = False  # packed weights, few rows: weights on the MMA's wide side (same sums)
    gluon: bool = False  # packed: the Gluon kernel where it applies (past 64 rows on pieces)
    staged: bool = False  # the Gluon kernel: a segment's words copied to shared memory at once
    ring: bool = False  # the Gluon kernel: the inputs through a ring of a few steps, not a segment
    hfma: bool = False  # the Gluon kernel, 4-bit: bf16x2 dequantization (single_rounding weights)
    deep: bool = (
        False  # the Gluon ring, 4 warps: each MMA queued before the one before is waited for
    )

    def step_k(self, plan: "LinearPlan") -> int:
        """K columns per loop step: `wide` plan blocks when the segment holds a whole number of them.
        One tl.dot over 2 or 4 blocks issues the same MMA chain as one per block (a tile's K width
        never changes a bit on the H200: docs/exactness.md, 'Measured on the H200'); the registry
        checks it."""
        k = plan.block_k * self.wide
        return k if plan.segment % k == 0 else plan.block_k


# 17-128 rows of a packed weight held unpacked too (`--unpacked-weights`) may read it in the
# dequantize-first shape: slower than the packed forms where each pass would dequantize it
HELD = Tiles(64, 128, 4, 3, dequant=True)

ROW_CLASSES = (1, 16, 32, 64, 128, 256, 512)  # the largest row count of each class but the last


def rows_class(m: int) -> int:
    """Row counts that share a launch shape: one stream's decode; few lanes' decode and verify;
    many lanes' decode (17-32, 33-64); verify passes of many lanes (16 lanes of 1 + K rows); the
    256-lane bucket's decode and short prompt chunks; longer chunks; long ones. An 80-row verify
    pass of 16 lanes sharing a 512-row prompt chunk's class took the dequantize-first shape, 5.7
    decode steps' time on the card; 129-256 rows have their own class for the same reason (a
    256-lane step timed at 512 rows, where each weight unpacked once to bf16 pays best)."""
    return next((c for c, top in enumerate(ROW_CLASSES) if m <= top), len(ROW_CLASSES))


def timing_rows(m: int) -> int:
    """The row count a rows class is timed at: its largest (the lane-count bucket that fills it),
    whatever pass meets it first; past the last class, the pass's own. Timed at the first count
    met, the 17-64 rows class took a 32-row tile's shape and a 64-lane decode step ran 15% slower."""
    c = rows_class(m)
    return ROW_CLASSES[c] if c < len(ROW_CLASSES) else m


def candidates(m: int, packed: bool, held: bool = False) -> list[Tiles]:
    """Launch shapes worth timing for m rows; the first is the untimed default (`held`: a packed
    weight held unpacked too, whose dequantize-first shape is offered from 17 rows). (Measured on
    the H200 and dropped: each 4-bit value gathered from its word, scaling in the words' own
    layout, few packed rows in the whole form, four blocks a step.)"""
    held_shape = [HELD] if held else []
    if m <= 16:
        shapes = [Tiles(16, n, 4, 4) for n in (32, 64, 128)]
        more = (
            [Tiles(16, 64, 4, 4, wide=2), Tiles(16, 128, 4, 4, wide=2)]
            + [Tiles(16, n, w, s, wide=x, swap=True) for n, w, s, x in SWAPPED]
            + _few_gluon()
            + _hfma(_few_gluon())
            if packed
            else [Tiles(16, n, 4, 4, whole=True) for n in (16, 32)]
        )
    elif m <= 64:  # the whole form too: a wide product's split sums cost a second pass over N
        shapes = [Tiles(64, n, 4, 3) for n in (64, 32, 128)] + [Tiles(64, 128, 4, 3, whole=True)]
        more = (
            _middle_packed()
            + [Tiles(64, 128, 8, 3, wide=2, swap=True, whole=True)]
            + _middle_gluon()
            + held_shape
            if packed
            else []
        )
    elif m <= SPLIT_MAX_ROWS:  # the split form (more programs) or the whole; 64- and 128-row tiles
        shapes = [Tiles(64, n, 4, 3) for n in (64, 128)] + [Tiles(128, 128, 8, 3)]
        shapes += [Tiles(64, 128, 4, 3, whole=True), Tiles(128, 128, 8, 3, whole=True)]
        more = _middle_packed() + _pieces() + held_shape if packed else []
    else:
        shapes = [Tiles(128, 128, 8, 3), Tiles(128, 64, 4, 3), Tiles(64, 128, 4, 3)]
        # many rows: the wider step, or each weight unpacked once to bf16 rather than once per row tile
        more = (
            [
                Tiles(128, 128, 8, 3, wide=2),
                Tiles(128, 128, 8, 3, dequant=True),
                Tiles(64, 128, 4, 3, dequant=True),
            ]
            if packed
            else []
        )
    return shapes + more


def _pieces() -> list[Tiles]:
    """The Gluon ring shapes (the 17-64 rows class's best on the 9B) for 65-512 packed rows,
    on pieces of each of PIECE_ROWS rows (the shape's block_m, the MMA's narrow side): without
    them a 16-lane verify pass of 80 rows and a 256-lane step leave the Gluon kernel for the
    Triton forms, several times slower a row on the card."""
    ring = [t for t in _middle_gluon() if t.ring]
    return [replace(t, block_m=rows) for rows in PIECE_ROWS for t in ring]


def _middle_packed() -> list[Tiles]:
    """Packed shapes of 17-128 rows beside the plain ones: the wider step, the swapped forms."""
    swapped = [Tiles(r, n, w, 3, wide=x, swap=True) for r, n, w, x in MIDDLE_SWAPPED]
    return [Tiles(64, 64, 4, 3, wide=2)] + swapped


def _middle_gluon() -> list[Tiles]:
    """The Gluon kernel for 17-64 rows: 4 warps (64 weight rows a program) or 8 (128), each with
    its staged twin; where it does not apply (shared memory, width) the Triton swapped form runs."""
    shapes = [Tiles(64, n, w, 3, wide=2, swap=True, gluon=True) for n, w in ((64, 4), (128, 8))]
    ring = [replace(t, ring=True) for t in shapes]
    return shapes + [replace(t, staged=True) for t in shapes] + ring + _hfma(ring)


def _few_gluon() -> list[Tiles]:
    """The Gluon kernel for one to 16 rows: the words two steps ahead in registers, or staged."""
    return [Tiles(16, 128, 4, 4, wide=2, swap=True, gluon=True, staged=s) for s in (False, True)]


def _hfma(shapes: list[Tiles]) -> list[Tiles]:
    """The Gluon shapes' bf16x2 twins: 4-bit weights that quant.single_rounding admits take
    them, every other weight runs the fp32 dequantization under them (the same values)."""
    return [replace(t, hfma=True) for t in shapes]


def untried(m: int) -> list[Tiles]:
    """Packed launch shapes built and checked but not offered to the tile book for m rows,
    for `benchmarks/kernels.py --untried` to time beside the candidates: at most 16 rows the
    Gluon kernel with its inputs through a ring (no gain at one row on the card, where a
    segment's inputs are 16 KiB), and at 17-64 rows the bf16x2 twins of the plain and staged
    Gluon shapes (the ring's beat them at every 9B product) and the 4-warp ring's deep twins
    (each MMA queued behind the one running: right on an H100, never the book's pick there);
    at 129-512 rows the ring shapes on pieces of 64 or 128 rows (on the card each product ran
    4-22% faster alone at 256 rows, a 256-lane step with them 3% slower: not offered yet)."""
    if m > PIECES_MAX_ROWS or 64 < m <= SPLIT_MAX_ROWS:
        return []
    if m > 64:
        return _pieces()
    if m > 16:
        deep = [replace(t, deep=True) for t in _middle_gluon() if t.ring and t.warps == 4]
        return _hfma([t for t in _middle_gluon() if not t.ring and not t.hfma]) + deep
    ring = [Tiles(16, 128, 4, 4, wide=2, swap=True, gluon=True, ring=True)]
    return ring + _hfma(ring)


# up to this many (row, expert) pairs an expert tile holds 16, else 64: a 64-lane decode pass with
# top-8 and the shared expert joined (9 choices a row) keeps the few-row tiles
GROUPED_SMALL_PAIRS = 576


def grouped_block_m(pairs: int) -> int:
    """Pairs a tile of the grouped expert products holds, for a pass of `pairs` pairs."""
    return 16 if pairs <= GROUPED_SMALL_PAIRS else 64


def grouped_candidates(block_m: int) -> list[Tiles]:
    """Launch shapes of the grouped expert products (ops/triton/moe.py) over tiles of block_m
    pairs; the first is the untimed default. Narrow columns give a decode-sized pass (8 experts,
    a row or two each) more programs; the swapped form puts the weights on the MMA's wide side;
    the Gluon kernel also splits each expert's K over its segments."""
    plain = [Tiles(block_m, n, 4, 3) for n in (64, 32, 16, 128)]
    swapped = [Tiles(block_m, 64, 4, 3, swap=True), Tiles(block_m, 128, 8, 3, swap=True)]
    if block_m > 16:
        return plain + swapped
    # few pairs a tile: the Gluon kernel split over segments (where it applies, else swapped)
    gluon = [Tiles(block_m, 64, 4, 3, swap=True, gluon=True, staged=s) for s in (False, True)]
    return plain + swapped + gluon


def gpu_seconds(fn, reps: int) -> float:
    """Device time per call of fn (already run once): `reps` calls captured in a CUDA graph and
    replayed, so Python's launch cost is not counted (decode passes replay from a graph too)."""
    graph = torch.cuda.CUDAGraph()
    with capturing(graph):
        for _ in range(reps):
            fn()
    graph.replay()  # the first replay uploads the graph
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / reps / 1e3


class TileBook:
    """Launch shapes chosen once per (product, rows class, N, K, format) by timing the candidates on
    the card, shared by every layer of a model. Only speed follows the choice: a row's bits are the
    same under every candidate (registry and tests/test_gpu.py)."""

    def __init__(self, reps: int = 10, untried: bool = False) -> None:
        self.chosen: dict[tuple, Tiles] = {}
        self.reps = reps
        self.untried = untried  # benchmarks only: the packed shapes of `untried` timed too

    def pick(
        self,
        key: tuple,
        m: int,
        packed: bool,
        run,
        options: list[Tiles] | None = None,
        timer=None,
        held: bool = False,
    ):
        """The launch shape for a product of m rows; `key` names the product and its rows class
        (`options`: the candidates when they are not a linear product's; `timer`: the product
        run at the rows class's timing rows, when they are not the pass's own; `held`: a packed
        weight held unpacked too)."""
        if key in self.chosen:
            return self.chosen[key]
        extra = untried(m) if packed and self.untried else []
        options = options or candidates(m, packed, held) + extra
        if len(options) == 1 or torch.cuda.is_current_stream_capturing():
            return options[0]
        times, timed = {}, timer or run
        for t in options:
            try:
                timed(t)  # compiles, and warms the caches
            except Exception:  # noqa: BLE001 - a shape the card cannot launch is not a choice
                if t is options[0]:
                    raise
                continue
            times[t] = gpu_seconds(lambda: timed(t), self.reps)  # noqa: B023
        self.chosen[key] = min(times, key=times.get) if times else options[0]
        return self.chosen[key]

    # -- the tile file: choices kept across starts (launch shapes only, never arithmetic) ----------
    def save(self, path: Path) -> None:
        """Writes every choice (atomically: a reader never sees half a file)."""
        entries = [{"key": list(k), "tiles": asdict(t)} for k, t in self.chosen.items()]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"entries": entries}, indent=0))
        tmp.replace(path)

    def load(self, path: Path) -> int:
        """Reads the choices a tile file holds; an entry that is not a candidate of its key's rows
        class (an edited file, another version's candidates) is left out and timed again.
        Returns how many were taken."""
        try:
            raw = json.loads(Path(path).read_text())
            entries = raw["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            return 0
        taken = 0
        for e in entries if isinstance(entries, list) else []:
            t = _tiles_from(e)
            key = tuple(e["key"]) if t is not None else ()
            if t is not None and key and t in _class_candidates(key):
                self.chosen[key] = t
                taken += 1
        return taken


_CLASS_ROWS = {c: top for c, top in enumerate(ROW_CLASSES)} | {len(ROW_CLASSES): 4096}


def _class_candidates(key: tuple) -> list[Tiles]:
    """The candidates of a key (rows class, N, K, format...): packed formats are (bits, group),
    and "held" after them for a weight held unpacked too."""
    if key and key[0] == "moe":  # ("moe", block_m, N, K, format..., part): grouped products
        return grouped_candidates(key[1]) if key[1] in (16, 64) else []
    if not key or key[0] not in _CLASS_ROWS:
        return []
    held = len(key) == 6 and key[5] == "held"
    return candidates(_CLASS_ROWS[key[0]], packed=len(key) >= 5, held=held)


def _tiles_from(entry) -> Tiles | None:
    try:
        raw = entry["tiles"]
        names = {f.name for f in fields(Tiles)}
        if not isinstance(raw, dict) or set(raw) - names or not isinstance(entry["key"], list):
            return None
        return Tiles(**raw)
    except (KeyError, TypeError):
        return None
