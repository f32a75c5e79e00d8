"""Mixed pass graphs, checked on the CPU with the graph recording stood in for: decoding lanes
(padded to their bucket) and one prompt piece of up to `--mixed-chunk` rows after them. On the
piece's real rows the graph's static batch equals the eager batch of the padded pass (its
padding rows write only the scratch KV row; the recurrence, the conv's kept rows, the attention
tiles and the logits row follow the real count); each lane gets the logits rows the eager pass
gives it, and a drafter reads the kept states of the plan's rows, padding left out."""

import pytest
import torch
from engine_util import make_engine, sample_prompt
from graph_util import stand_in_recording

from tensorfold.engine.passes import logit_rows
from tensorfold.engine.request import SamplingParams, Watch
from tensorfold.runner.cuda_graph import (
    LONE_PIECES,
    GraphShape,
    graph_shape,
    lane_buckets,
    piece_room,
)
from tensorfold.runner.plan import PassPlan, padded

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
# the graphs' piece: beside 1 or 4 decoding rows its room is 127 or 124 rows (the pass ends on
# 128), two attention tiles of 64: a short piece leaves the second empty
PIECE = 128


def plan(*lanes) -> PassPlan:
    return PassPlan(tuple(req.rows(n, logit_rows(req, n)) for req, n in lanes))


class _Tagged:
    """Stands in for the model: each wanted row's 'logits' and every row's kept state are its
    token and position, so a row handed to the wrong lane is seen."""

    def __init__(self, model):
        self.device, self.config, self.gdn_form = model.device, model.config, model.gdn_form
        self.batch, self.hidden, self.tapped = None, None, None

    def forward(self, batch, caches):
        self.batch = batch
        rows = torch.stack([batch.token_ids, batch.positions], 1)
        self.hidden, self.tapped = rows.float(), rows.float() + 0.5
        return rows[batch.logit_rows]


@pytest.fixture
def recording(monkeypatch):
    """torch.cuda's graph recording stood in for: a recorded pass runs once, eagerly."""
    stand_in_recording(monkeypatch)


def _streams(hf_tiny_b, decoding: int, prompt_len: int, more: int = 0):
    """An engine with `decoding` lanes generating and one lane that has read none of its
    prompt; a slot for the padding lane and `more` for other lanes."""
    eng = make_engine(hf_tiny_b, parallel=decoding + 2 + more, context=512, mixed_chunk=PIECE)
    reqs = [eng.add_request(sample_prompt(40 + i, 5 + 7 * i, 300), GREEDY) for i in range(decoding)]
    while any(r.in_prompt or not r.output_ids for r in reqs):
        eng.step()
    reader = eng.add_request(sample_prompt(77, prompt_len, 300), GREEDY)
    eng.step()  # admitted: its first piece beside the decoding lanes
    assert reader.lane.computed == PIECE
    eng.runner.piece_rows = PIECE
    eng.runner.pad_lanes((1, 2, 4, 8))
    return eng, reqs, reader


def _same_batch(g, e, scratch: int) -> None:
    """The graph's static batch g equals the eager batch e on e's rows (tiles read the same
    table rows); g's rows past them write the scratch KV row."""
    m = e.num_rows
    assert torch.equal(g.token_ids[:m], e.token_ids) and torch.equal(g.positions[:m], e.positions)
    assert torch.equal(g.kv_write[:m], e.kv_write) and set(g.kv_write[m:].tolist()) <= {scratch}
    gl, el = g.lanes, e.lanes
    assert torch.equal(gl.slots, el.slots) and torch.equal(gl.cu_seqlens, el.cu_seqlens)
    assert torch.equal(gl.conv_taps[:m], el.conv_taps) and torch.equal(gl.conv_keep, el.conv_keep)
    assert torch.equal(gl.tails, el.tails)
    # each real row in some tile at its position, reading its lane's table up to it (a short
    # piece may be cut in 16-row tiles eagerly and in 64-row ones in the graph: the same bits)
    assert _tiled_rows(gl.attention) == _tiled_rows(el.attention)


def _tiled_rows(tiles) -> dict[int, tuple[int, list[int]]]:
    """{pass row: (its position, the KV rows of its lane's positions up to it)}"""
    out = {}
    for t in range(tiles.row0.shape[0]):
        base = int(tiles.table_base[t])
        for j in range(int(tiles.rows[t])):
            pos = int(tiles.pos0[t]) + j
            out[int(tiles.row0[t]) + j] = (pos, tiles.kv_rows[base : base + pos + 1].tolist())
    return out


def _check(runner, work: PassPlan, want_shape: GraphShape) -> None:
    shape = runner.shape(work)
    assert shape == want_shape
    real = runner.model
    fake = runner.model = _Tagged(real)
    runner.graphs.clear()  # a new graph each time: its recorded pass runs for real here
    got = runner._replay(work, shape)
    graph_batch, kept = fake.batch, (fake.hidden, fake.tapped)
    # a prompt piece alone has no padding lane
    lanes = next(b for b in runner.buckets if b >= shape.lanes) if shape.lanes else 0
    full = padded(work, len(work) + lanes - shape.lanes, runner.pad_lane(1), at=shape.lanes)
    _same_batch(graph_batch, runner.batch(full)[0], int(runner.pad[1][0]))
    eager, owners = runner.batch(work)
    want = fake.forward(eager, None)
    assert sorted(got) == sorted(set(owners))
    for i in got:
        assert torch.equal(got[i], want[[r for r, o in enumerate(owners) if o == i]])
    # the plan's rows in order, as Drafting.observe reads them (past them, the piece's padding)
    rows = eager.num_rows
    assert torch.equal(kept[0][:rows], fake.hidden) and torch.equal(kept[1][:rows], fake.tapped)
    assert kept[0].shape[0] == rows + shape.prompt - work.lanes[-1].rows
    runner.model = real


@pytest.mark.parametrize("decoding", [1, 3, 4])  # padded to 1, 4 (one padding lane), 4
def test_mixed_graph_batch_and_rows_match_the_eager_pass(hf_tiny_b, recording, decoding):
    eng, reqs, reader = _streams(hf_tiny_b, decoding, 2 * PIECE + 30)
    runner = eng.runner
    room = piece_room(PIECE, next(b for b in runner.buckets if b >= decoding))
    assert 64 < room < PIECE
    middle = plan(*((r, 1) for r in reqs), (reader, room))
    assert len(middle.lanes[-1].logits) == 0  # a piece inside the prompt wants no logits
    _check(runner, middle, GraphShape(decoding, 1, room))
    short = plan(*((r, 1) for r in reqs), (reader, 21))  # 21 real rows: the second tile empty
    _check(runner, short, GraphShape(decoding, 1, room))
    reader.lane.computed = 2 * PIECE  # the prompt's last piece (30 rows): its last row's logits
    last = plan(*((r, 1) for r in reqs), (reader, 30))
    assert last.lanes[-1].logits == range(29, 30)
    _check(runner, last, GraphShape(decoding, 1, room))
    reader.lane.computed = 2 * PIECE + 28  # two rows: the conv keeps a row of its old state
    _check(runner, plan(*((r, 1) for r in reqs), (reader, 2)), GraphShape(decoding, 1, room))
    reader.lane.computed = 2 * PIECE + 29  # the prompt's last row: as another decoding lane
    one_row = plan(*((r, 1) for r in reqs), (reader, 1))
    assert graph_shape(one_row, runner.graph_rows, PIECE) == GraphShape(decoding + 1, 1)


def test_a_prompt_alone_replays_the_smallest_lone_graph_it_fits(hf_tiny_b, recording):
    """A prompt piece read alone replays a mixed graph with no decoding lane: the smallest of
    LONE_PIECES (each the top of a products' rows class) it fits, its rows past the real ones
    padding; its graph batch equals the eager batch on the real rows and it gets the eager
    pass's logits row. A longer piece, one wanting every row's logits, or a runner without
    padding lanes (no scratch row) reads it eagerly."""
    eng = make_engine(hf_tiny_b, parallel=3, context=512, chunk=64)
    runner = eng.runner
    runner.pad_lanes(lane_buckets(3))
    runner.lone_pieces = LONE_PIECES
    reader = eng.add_request(sample_prompt(81, 300, 300), GREEDY)
    eng.step()  # the first 64 rows, eagerly (no graphs on the CPU)
    assert reader.lane.computed == 64
    for rows, piece in [(6, 16), (15, 16), (16, 16), (17, 32), (33, 64), (40, 64)]:
        reader.lane.computed = 300 - rows  # the prompt's last piece: its last row's logits
        work = plan((reader, rows))
        assert work.lanes[-1].logits == range(rows - 1, rows)
        _check(runner, work, GraphShape(0, 1, piece))
    # a last piece of 1 to 1 + K rows is a lane of a decode or verify graph, as before
    reader.lane.computed = 300 - 3
    assert runner.shape(plan((reader, 3))) == GraphShape(1, 3)
    reader.lane.computed = 0  # a first piece inside the prompt wants no logits
    _check(runner, plan((reader, 64)), GraphShape(0, 1, 64))
    assert runner.shape(plan((reader, 65))) == GraphShape(0, 1, 128)
    assert runner.shape(plan((reader, 129))) is None  # past the largest piece: eager
    one = frozenset({1})
    assert graph_shape(plan((reader, 40)), one, 64) is None  # no padding lanes: no scratch row
    runner.lone_pieces = ()
    assert runner.shape(plan((reader, 40))) is None
    watched = eng.add_request(sample_prompt(82, 40, 300), GREEDY, watch=Watch(keep_logits=True))
    eng.step()
    assert graph_shape(plan((watched, 8)), one, 64, runner.buckets) is None  # every row's logits


def test_mixed_graph_shapes(hf_tiny_b):
    """Only decoding lanes of equal rows and then one prompt piece of at most the graphs' piece
    rows, wanting no logits or its last row's, make a mixed graph's pass."""
    eng, reqs, reader = _streams(hf_tiny_b, 2, 3 * PIECE, more=2)
    one = frozenset({1})
    a, b = reqs
    assert graph_shape(plan((a, 1), (b, 1)), one, PIECE) == GraphShape(2, 1)
    room = piece_room(PIECE, 1)  # beside one decoding row
    assert graph_shape(plan((a, 1), (reader, room)), one, PIECE) == GraphShape(1, 1, room)
    assert graph_shape(plan((a, 1), (reader, 7)), one, PIECE) == GraphShape(1, 1, room)
    assert graph_shape(plan((a, 1), (reader, room)), one, 0) is None  # no mixed graphs
    assert graph_shape(plan((a, 1), (reader, room + 1)), one, PIECE) is None  # too long
    assert graph_shape(plan((reader, PIECE)), one, PIECE) is None  # no decoding lane
    assert graph_shape(plan((reader, PIECE), (a, 1)), one, PIECE) is None  # prompt not last
    assert graph_shape(plan((a, 1), (b, 2), (reader, PIECE)), one, PIECE) is None  # rows differ
    other = eng.add_request(sample_prompt(78, 40, 300), GREEDY)
    eng.step()
    two = plan((a, 1), (other, 8), (reader, 8))
    assert graph_shape(two, one, PIECE) is None  # two prompt lanes
    watched = eng.add_request(sample_prompt(79, 40, 300), GREEDY, watch=Watch(keep_logits=True))
    eng.step()
    assert graph_shape(plan((a, 1), (watched, 8)), one, PIECE) is None  # every row's logits


def test_a_piece_ends_the_pass_on_a_product_tile():
    """A piece's room beside `decode` rows (padding lanes' included) ends the pass's rows on the
    top of a products' rows class (64, 128, 256, 512; past them a multiple of 128 rows), unless
    that leaves less than half the piece."""
    assert [piece_room(128, d) for d in (0, 1, 16, 64, 100, 128, 136)] == [
        128, 127, 112, 64, 128, 128, 120,
    ]  # fmt: skip
    assert piece_room(256, 16) == 240 and piece_room(8, 3) == 8
    # 16 streams and a 64-row piece: a 64-row pass, not an 80-row one in the 65-128 rows class
    assert piece_room(64, 16) == 48 and piece_room(64, 1) == 63 and piece_room(80, 4) == 60
    assert piece_room(512, 256) == 512 and piece_room(512, 300) == 468  # 768 rows both
    for piece, decode in [(64, 16), (128, 1), (48, 8), (512, 300), (100, 100)]:
        room = piece_room(piece, decode)
        assert piece // 2 <= room <= piece


def test_the_scheduler_cuts_pieces_to_the_mixed_graphs_room(hf_tiny_b):
    """With mixed graphs the prompt piece beside decoding lanes is the graph's room for their
    bucket (3 lanes replay the 4-lane graph: 124 rows), and the pass is that graph's."""
    eng = make_engine(hf_tiny_b, parallel=5, context=512, chunk=256, mixed_chunk=128)
    reqs = [eng.add_request(sample_prompt(60 + i, 9, 300), GREEDY) for i in range(3)]
    while any(r.in_prompt or not r.output_ids for r in reqs):
        eng.step()
    runner = eng.runner
    runner.piece_rows, runner.buckets = 128, lane_buckets(5)
    eng.scheduler.mixed_room = runner.mixed_room
    shapes, execute = [], runner.execute
    runner.execute = lambda plan: (
        shapes.append(graph_shape(plan, runner.graph_rows, runner.piece_rows, runner.buckets))
        or execute(plan)
    )
    reader = eng.add_request(sample_prompt(70, 300, 300), GREEDY)
    eng.step()
    assert reader.lane.computed == 124 and shapes[-1] == GraphShape(3, 1, 124)
    eng.step()
    assert reader.lane.computed == 248 and shapes[-1] == GraphShape(3, 1, 124)
    eng.step()  # the last 52 rows: the same graph, its rows past them padding
    assert not reader.in_prompt and shapes[-1] == GraphShape(3, 1, 124)
