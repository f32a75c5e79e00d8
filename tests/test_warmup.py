"""The warm-up before serving: the tile file round-trips and refuses what is not a candidate, the
warm-up leaves no trace in the engine (warmed = cold, token for token), and the server says
"loading" until it ends; with mixed graphs it reads a prompt beside lanes falling through every
lane-count bucket."""

from __future__ import annotations

import threading

import torch
from server_harness import make_engine, solo, start_server, wait_for

from tensorfold.engine.request import SamplingParams
from tensorfold.engine.warmup import mixed_ends, run_steps, warm_up, warmup_steps
from tensorfold.ops.quant import QuantizedWeight, quantize
from tensorfold.ops.triton.linear import matmul
from tensorfold.ops.triton.tiles import (
    ROW_CLASSES,
    TileBook,
    Tiles,
    candidates,
    grouped_candidates,
    rows_class,
    timing_rows,
    untried,
)
from tensorfold.runner.cuda_graph import bucket, graph_shape, lane_buckets

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def test_tile_file_round_trip(tmp_path):
    book = TileBook()
    book.chosen[(rows_class(1), 4096, 12288, 4, 64)] = candidates(1, packed=True)[-1]
    book.chosen[(rows_class(4096), 1024, 2048, "torch.bfloat16")] = candidates(4096, packed=False)[
        1
    ]
    path = tmp_path / "tiles.json"
    book.save(path)
    again = TileBook()
    assert again.load(path) == 2
    assert again.chosen == book.chosen


def test_tile_file_leaves_out_what_is_not_a_candidate(tmp_path):
    book = TileBook()
    book.chosen[(0, 64, 64, 4, 64)] = Tiles(16, 999, 4, 4)  # no rows class offers it
    book.chosen[(len(ROW_CLASSES) + 1, 64, 64, 4, 64)] = candidates(1, packed=True)[0]  # no class
    book.chosen[(rows_class(16), 64, 64, 4, 64)] = candidates(40, packed=True)[0]  # 40 rows' shape
    book.chosen[(rows_class(40), 64, 64, 4, 64)] = candidates(40, packed=True)[0]
    path = tmp_path / "tiles.json"
    book.save(path)
    again = TileBook()
    assert again.load(path) == 1 and list(again.chosen) == [(rows_class(40), 64, 64, 4, 64)]
    path.write_text('{"entries": [{"key": [0, 1, 2, 4, 64], "tiles": {"block_m": "x", "bad": 1}}]}')
    assert TileBook().load(path) == 0
    path.write_text("not json")
    assert TileBook().load(path) == 0
    assert TileBook().load(tmp_path / "missing.json") == 0


def test_untried_shapes_are_not_offered_nor_taken_from_a_tile_file(tmp_path):
    """The shapes the kernel benchmark times beside the candidates (the ring at one to 16
    rows, the bf16x2 twins of the plain and staged Gluon shapes and the 4-warp ring's deep
    twins at 17-64) are offered by no rows class, and a tile file naming them is timed again."""
    book = TileBook()
    for m in (1, 16, 40, 64):
        shapes = untried(m)
        assert shapes and all(t.gluon and (t.ring or t.hfma or t.deep) for t in shapes)
        assert not set(shapes) & set(candidates(m, packed=True))
        for t in shapes[:2]:
            book.chosen[(rows_class(m), 64, 64 + t.hfma, 4, 64)] = t
    assert untried(65) == [] and any(t.ring for t in candidates(65, packed=True))  # offered
    assert untried(129) and all(t.ring for t in untried(129))  # the ring on pieces
    assert not any(t.gluon for t in candidates(129, packed=True))
    assert untried(513) == []
    assert all(t.ring and not t.deep for t in untried(1))
    middle = untried(64)
    assert all(t.deep == t.ring for t in middle) and any(t.deep for t in middle)
    assert all(t.warps == 4 for t in middle if t.deep)
    path = tmp_path / "tiles.json"
    book.save(path)
    assert TileBook().load(path) == 0


def test_a_benchmark_book_times_the_untried_shapes_too(monkeypatch):
    """`TileBook(untried=True)` (h200.py --untried) times the untried shapes beside the
    candidates; a serving book never sees them."""
    import tensorfold.ops.triton.tiles as tiles

    monkeypatch.setattr(tiles.torch.cuda, "is_current_stream_capturing", lambda: False)
    # the timed call returns its shape; the untried shapes time fastest
    fast = set(untried(1)) | set(untried(64))
    monkeypatch.setattr(tiles, "gpu_seconds", lambda fn, reps: 1.0 if fn() in fast else 2.0)
    for m in (1, 64):
        for wide in (False, True):
            t = TileBook(untried=wide).pick(("k", m), m, True, lambda t: t)
            assert (t in untried(m)) == wide


def test_tile_file_keeps_grouped_expert_shapes(tmp_path):
    """The grouped expert products' choices (keys "moe", pairs a tile, N, K, format, part)
    round-trip; a shape that is not a grouped candidate, or a tile size the table never uses,
    is left out."""
    book = TileBook()
    book.chosen[("moe", 16, 512, 2048, 4, 64, "gate-up")] = grouped_candidates(16)[-1]
    book.chosen[("moe", 64, 2048, 512, 4, 64, "down")] = grouped_candidates(64)[2]
    book.chosen[("moe", 16, 512, 2048, 4, 64, "down")] = candidates(1, packed=True)[-1]
    book.chosen[("moe", 32, 512, 2048, 4, 64, "down")] = grouped_candidates(16)[0]
    path = tmp_path / "tiles.json"
    book.save(path)
    again = TileBook()
    assert again.load(path) == 2
    assert set(again.chosen) == {
        ("moe", 16, 512, 2048, 4, 64, "gate-up"),
        ("moe", 64, 2048, 512, 4, 64, "down"),
    }


def test_a_product_of_no_rows_is_not_timed():
    """A prompt pass with no logits rows (every chunk of a long prompt but its last) runs the head
    on zero rows: nothing is launched, and the tile book keeps no choice for the decode rows
    class made from timing empty launches."""
    book = TileBook()
    packed = QuantizedWeight(*quantize(torch.randn(48, 128), 4, 64), 4, 64)
    for w in (packed, torch.randn(48, 128)):
        y = matmul(torch.empty(0, 128), w, book)
        assert y.shape == (0, 48) and not book.chosen


def test_steps_reach_every_rows_class_and_lane_count():
    steps = warmup_steps(parallel=16, chunk=2048, context=4096)
    prompts = {rows_class(n) for n, lanes in steps if lanes == 1}
    assert prompts | {rows_class(1)} == set(range(len(ROW_CLASSES) + 1))  # decode: one row
    assert (1, 16) in steps  # 16 lanes that finish one by one: every decode lane count
    assert all(n + lanes + 1 <= 4096 for n, lanes in warmup_steps(4, 4096, 4096))


def test_warmed_engine_gives_cold_tokens(hf_tiny):
    cold = make_engine(hf_tiny, prompt_cache_bytes=1 << 20)
    warm = make_engine(hf_tiny, prompt_cache_bytes=1 << 20)
    steps = warmup_steps(4, 600, 512)  # prompts of 16, 32, 64, 128, 256, 507 tokens; 4 lanes
    assert run_steps(warm, steps, budget_s=120) == len(steps) == 7
    assert len(warm.prefix_cache) == 0 and warm.prefix_cache.budget_bytes == 1 << 20
    assert not warm.has_work() and not warm.scheduler.running
    prompt = [5, 9, 14, 3, 3, 7, 100, 42, 17]
    assert solo(warm, prompt, GREEDY) == solo(cold, prompt, GREEDY)
    assert warm_up(cold).skipped  # the CPU has no launch shapes: nothing runs at start


def test_warm_up_samples_every_count_of_sampled_rows(hf_tiny, monkeypatch):
    """The sampling kernels compile apart for one row, a multiple of 16 and other counts: the
    warm-up's lanes (half of them sampled, finishing one after another) reach each count from
    its largest down to one, so no user's first sampled token waits for a compile."""
    from tensorfold.ops import dispatch

    counts, real = [], dispatch.sample_rows
    monkeypatch.setattr(dispatch, "sample_rows", lambda r, *a: counts.append(len(r)) or real(r, *a))
    eng = make_engine(hf_tiny, parallel=32, chunk=64)  # all 32 prompts in the first pass
    assert run_steps(eng, [(1, 32)], budget_s=120) == 1
    assert set(counts) == set(range(1, 17))  # 16 sampled lanes of the 32, then fewer, to one


def test_server_loading_until_warmup_ends(hf_tiny):
    release, started = threading.Event(), threading.Event()

    def warmup():
        started.set()
        assert release.wait(30)

    live = start_server(make_engine(hf_tiny), warmup=warmup)
    try:
        wait_for(started.is_set, "the warm-up to start")
        with live.client() as http:
            health = http.get("/health")
            assert (health.status_code, health.json()) == (503, {"status": "loading"})
            busy = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert busy.status_code == 503 and busy.json()["error"]["code"] == "loading"
            assert busy.headers["retry-after"]
            release.set()
            wait_for(lambda: http.get("/health").status_code == 200, "the warm-up to end")
            done = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert done.status_code == 200
    finally:
        release.set()
        live.stop()


def test_failed_warmup_still_serves(hf_tiny):
    def warmup():
        raise RuntimeError("planted warm-up failure")

    live = start_server(make_engine(hf_tiny), warmup=warmup)
    try:
        with live.client() as http:
            wait_for(lambda: http.get("/health").status_code == 200, "the server to be ready")
            assert (
                http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code
                == 200
            )
    finally:
        live.stop()


def test_mixed_ends_fall_through_every_bucket():
    buckets = lane_buckets(64)
    ends = mixed_ends(63, buckets)
    alive = [sum(e > t for e in ends) for t in range(1, max(ends))]  # decode passes
    assert [bucket(n, buckets) for n in alive] == [64, 56, 48, 40, 32, 24, 16, 8, 4, 2, 1]
    assert mixed_ends(1, (1, 2)) == [2]


def test_mixed_warm_up_runs_a_mixed_pass_of_every_bucket(hf_tiny):
    """On the CPU the passes run eagerly; each bucket's pass is of a mixed graph's shape."""
    eng = make_engine(hf_tiny, parallel=6, context=512, chunk=64, mixed_chunk=8)
    runner, shapes, execute = eng.runner, [], eng.runner.execute
    runner.piece_rows, runner.buckets = 8, lane_buckets(6)

    def seen(plan):
        shapes.append(graph_shape(plan, runner.graph_rows, runner.piece_rows))
        return execute(plan)

    runner.execute = seen
    assert run_steps(eng, [], budget_s=120) == 1
    mixed = {bucket(s.lanes, runner.buckets) for s in shapes if s is not None and s.prompt}
    assert mixed == set(runner.buckets) == {1, 2, 4, 6}  # 5 decoding lanes replay the 6 graph
    assert not eng.has_work() and not eng.scheduler.running


def test_a_rows_class_is_timed_at_its_own_rows(monkeypatch):
    """Whatever pass meets a rows class first, its candidates are timed through the timer (the
    product at the class's largest row count), never on the pass's rows, and the fastest is kept."""
    from tensorfold.ops.triton import tiles

    assert [timing_rows(m) for m in (1, 2, 16, 17, 40, 64, 65, 129, 256, 257, 600)] == [
        1, 16, 16, 32, 64, 64, 128, 256, 256, 512, 600,
    ]  # fmt: skip
    options = candidates(40, packed=True)
    fastest = options[2]
    timed, ran = [], []
    monkeypatch.setattr(tiles, "gpu_seconds", lambda fn, reps: fn() or 1.0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def timer(t):
        timed.append(t)
        return 0.5 if t == fastest else None  # gpu_seconds: fn() or 1.0

    key = (rows_class(40), 64, 64, 4, 64)
    assert TileBook().pick(key, 40, True, ran.append, timer=timer) == fastest
    assert not ran and set(timed) == set(options)
