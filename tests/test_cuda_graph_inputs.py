"""The pass graphs' static inputs, checked on the CPU against the eager pass's batch: the same
tokens, positions, KV write rows, attention tiles and slot tables, state slots, conv gathers, and
each lane's logits rows, for decode passes and for verify passes (1 + K rows per lane, a lane
recomputing committed rows after a rejection included); and the index lists a pass sends, made into
int64 tensors through numpy (util.longs)."""

import pytest
import torch
from drafting_util import Script
from engine_util import make_engine, sample_prompt
from graph_util import stand_in_recording

from tensorfold.engine.passes import logit_rows
from tensorfold.engine.request import SamplingParams, Watch
from tensorfold.runner.cuda_graph import PassGraph, graph_rows, lane_logits
from tensorfold.runner.plan import PassPlan
from tensorfold.util import join, longs

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def plan(*lanes) -> PassPlan:
    """The pass plan of (request, rows) pairs, as the engine builds it."""
    return PassPlan(tuple(req.rows(n, logit_rows(req, n)) for req, n in lanes))


class _Capture:
    """Stands in for the model: records the batch it is given and returns, as each wanted row's
    'logits', its token and position (so a row handed to the wrong lane is seen)."""

    def __init__(self, model):
        self.device, self.config, self.batch = model.device, model.config, None
        self.gdn_form = model.gdn_form

    def forward(self, batch, caches):
        self.batch = batch
        return torch.stack([batch.token_ids, batch.positions], 1)[batch.logit_rows]


def _same_batch(graph_batch, eager_batch) -> None:
    g, e = graph_batch, eager_batch
    assert torch.equal(g.token_ids, e.token_ids) and torch.equal(g.positions, e.positions)
    assert torch.equal(g.kv_write, e.kv_write)
    gl, el = g.lanes, e.lanes
    assert torch.equal(gl.slots, el.slots) and torch.equal(gl.cu_seqlens, el.cu_seqlens)
    # the slots each lane's state is left in: a verify pass's spares, else the lanes' own
    assert torch.equal(gl.writes, el.slots if el.writes is None else el.writes)
    assert torch.equal(gl.conv_taps, el.conv_taps) and torch.equal(gl.conv_keep, el.conv_keep)
    # the most rows of a lane: the conv's launch form (one launch up to 8) is the eager pass's
    assert gl.most_rows == el.most_rows > 0 and not gl.padded
    tiles, ref = gl.attention, el.attention
    assert tiles.row0.tolist() == ref.row0.tolist() and tiles.rows.tolist() == ref.rows.tolist()
    assert tiles.pos0.tolist() == ref.pos0.tolist()
    for t in range(ref.row0.shape[0]):  # each tile reads its lane's rows for positions 0..its last
        n = int(ref.pos0[t] + ref.rows[t])
        base, ref_base = int(tiles.table_base[t]), int(ref.table_base[t])
        assert torch.equal(tiles.kv_rows[base : base + n], ref.kv_rows[ref_base : ref_base + n])


def _check_pass(runner, work: PassPlan, rows: int, graphs: dict) -> None:
    """The graph's batch and logits rows for `work` equal the eager pass's."""
    key = (len(work), rows)
    if key not in graphs:  # one graph per shape, reused: its tables reload as lanes change
        graphs[key] = PassGraph(
            _Capture(runner.model), runner.caches, len(work), rows, runner.context
        )
    graph = graphs[key]
    fake = graph.model
    graph._load(work)
    got = lane_logits(work, rows, graph._forward())
    eager, owners = runner.batch(work)
    _same_batch(fake.batch, eager)
    want = fake.forward(eager, None)
    assert sorted(got) == sorted(set(owners))
    for i in got:
        assert torch.equal(got[i], want[[r for r, o in enumerate(owners) if o == i]])


def test_decode_graph_inputs_match_the_eager_batch(hf_tiny_b):
    eng = make_engine(hf_tiny_b, parallel=3, context=256)
    reqs = [eng.add_request(sample_prompt(90 + i, 5 + 9 * i, 300), GREEDY) for i in range(3)]
    while any(r.in_prompt or not r.output_ids for r in reqs):
        eng.step()
    work = plan(*((r, 1) for r in reqs))
    assert graph_rows(work, frozenset({1})) == 1
    _check_pass(eng.runner, work, 1, {})


@pytest.mark.parametrize("k", [3, 17])  # 17: a lane's 18 rows span two attention tiles
def test_verify_graph_inputs_match_the_eager_batch(hf_tiny_b, k):
    """Every pass of a drafting engine (drafts right and wrong) whose shape a graph serves is
    checked: most passes are, and some recompute committed rows after a rejection."""
    prompts = [sample_prompt(90 + i, 5 + 9 * i, 300) for i in range(3)]
    plain = make_engine(hf_tiny_b, parallel=3, context=256)
    replies = [plain.add_request(p, GREEDY) for p in prompts]
    plain.run_until_done()
    script = Script(
        {tuple(p): r.output_ids for p, r in zip(prompts, replies)}, lambda p: p % 5 == 3
    )
    eng = make_engine(hf_tiny_b, parallel=3, context=256, draft="ngram", draft_tokens=k)
    eng.drafting.default, eng.drafting.align = script, True  # as on a GPU with graphs
    runner, execute, graphs, seen = eng.runner, eng.runner.execute, {}, []

    def checked(work):
        rows = graph_rows(work, runner.graph_rows)
        if rows is not None:
            _check_pass(runner, work, rows, graphs)
            seen.append((rows, [lane.logits.start + 1 for lane in work]))  # rows pending
        return execute(work)

    runner.execute = checked
    reqs = [eng.add_request(p, GREEDY) for p in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in reqs] == [r.output_ids for r in replies]
    verify = [pending for rows, pending in seen if rows == 1 + k]
    assert runner.graph_rows == set(range(1, 2 + k)) and len(verify) >= 3
    assert any(p > 1 for pending in verify for p in pending)  # rows recomputed in a graph pass


def test_aligned_short_proposals_are_padded_to_a_graph_pass(hf_tiny_b):
    """Aligned (a GPU with graphs), a prediction shorter than K is padded with its last token:
    the verify pass keeps 1 + K rows, the output stays plain's, and the usage counts only the
    prediction's own tokens."""
    k, prompt = 4, sample_prompt(7, 12, 300)
    plain = make_engine(hf_tiny_b, context=256)
    want = plain.add_request(prompt, GREEDY)
    plain.run_until_done()
    eng = make_engine(hf_tiny_b, context=256, draft_tokens=k)
    eng.drafting.align = True
    passes, execute = [], eng.runner.execute
    eng.runner.execute = lambda work: passes.append([x.rows for x in work]) or execute(work)
    req = eng.add_request(prompt, GREEDY, prediction=want.output_ids[:6])
    real, verify = [], eng.drafting.verify
    eng.drafting.verify = lambda r, *rest: real.append(r.lane.draft.real) or verify(r, *rest)
    eng.run_until_done()
    assert req.output_ids == want.output_ids
    replies = [rows for (rows,) in passes[1:]]  # after the prompt's pass
    assert replies.count(1 + k) == len(real) and min(real) < k  # some padded
    assert set(replies) <= eng.runner.graph_rows  # recomputing passes are graphs' shapes too
    d = req.lane.draft
    assert d.prediction_accepted == 4 and d.prediction_accepted + d.prediction_rejected == sum(real)


def test_graph_passes_are_lanes_of_equal_rows_with_their_last_logits(hf_tiny_b):
    """A graph serves a pass where every lane feeds the same allowed number of rows and needs
    the logits of a suffix of them (engine/passes.py logit_rows); a watch keeping every logit row sees
    the same path as production."""
    eng = make_engine(hf_tiny_b)
    one = frozenset({1})
    req = eng.add_request(sample_prompt(1, 10, 300), SamplingParams(max_tokens=2))
    kept = eng.add_request(
        sample_prompt(2, 10, 300), SamplingParams(max_tokens=2), watch=Watch(keep_logits=True)
    )
    assert graph_rows(plan((req, 10)), one) is None and graph_rows(plan((kept, 10)), one) is None
    assert graph_rows(plan((kept, 10)), frozenset({1, 10})) == 10  # every row's logits: a suffix
    assert graph_rows(plan((req, 1)), one) is None  # a prompt row whose logits nobody needs
    assert graph_rows(plan((req, 10)), frozenset({10})) == 10  # the prompt's last row: a suffix
    eng.step()
    assert graph_rows(plan((req, 1)), one) == 1 and graph_rows(plan((req, 1), (kept, 1)), one) == 1
    assert graph_rows(plan((req, 1), (kept, 2)), frozenset({1, 2})) is None  # rows differ


def test_verify_lane_wants_its_last_committed_row_and_every_draft(hf_tiny_b):
    eng = make_engine(hf_tiny_b, draft="ngram", draft_tokens=3)
    eng.drafting.default = Script({}, lambda p: False)
    req = eng.add_request(sample_prompt(3, 10, 300), SamplingParams(max_tokens=8))
    eng.step()
    req.lane.draft.proposal = [5, 6, 7]
    assert graph_rows(plan((req, 4)), eng.runner.graph_rows) == 4
    assert graph_rows(plan((req, 5)), eng.runner.graph_rows) is None  # 5 rows: more than 1 + K
    req.lane.computed -= 1  # a committed row to recompute: 2 + 3 rows, the last 4 wanted
    assert logit_rows(req, 5) == range(1, 5)
    assert graph_rows(plan((req, 5)), frozenset({5})) == 5
    logits = torch.arange(10.0).view(5, 2)
    assert torch.equal(lane_logits(plan((req, 5)), 5, logits)[0], logits[1:])


class _Kept(_Capture):
    """A model that keeps each pass's states (as for an MTP or DFlash drafter): new tensors
    every forward, tagged by the call."""

    def __init__(self, model):
        super().__init__(model)
        self.calls, self.hidden, self.tapped = 0, None, None

    def forward(self, batch, caches):
        self.calls += 1
        self.hidden = torch.full((batch.num_rows, 2), float(self.calls))
        self.tapped = self.hidden + 0.5
        return super().forward(batch, caches)


def test_a_replay_hands_the_drafter_the_graphs_kept_states(hf_tiny_b, monkeypatch):
    """The first run returns the eager pass's logits and kept states (the recorded pass is not
    run); a replay points the model's kept states at the recorded pass's buffers."""
    stand_in_recording(monkeypatch)
    eng = make_engine(hf_tiny_b, parallel=2, context=256)
    reqs = [eng.add_request(sample_prompt(5 + i, 7, 300), GREEDY) for i in range(2)]
    while any(r.in_prompt for r in reqs):
        eng.step()
    fake = _Kept(eng.model)
    graph = PassGraph(fake, eng.caches, 2, 1, 256)
    graph.run(plan(*((r, 1) for r in reqs)))
    assert fake.calls == 2 and float(fake.hidden[0, 0]) == 1.0  # eager pass's, not the recorded
    assert float(fake.tapped[0, 0]) == 1.5
    fake.hidden = fake.tapped = None  # an eager pass in between keeps its own
    graph.run(plan(*((r, 1) for r in reqs)))
    assert fake.calls == 2 and float(fake.hidden[0, 0]) == 2.0 and float(fake.tapped[0, 0]) == 2.5


def test_a_chunk_form_graph_takes_no_write_slots_and_refuses_a_lane_that_asks(hf_tiny_b):
    """The chunk forms' kernels keep each lane's state in its slot: their graphs hand the
    kernels no write slots (LaneIndex.writes None, which they would refuse), and a lane that
    asks to leave its state elsewhere is refused by name, not written in place."""
    eng = make_engine(hf_tiny_b, parallel=2, context=256, gdn_form="chunk")
    reqs = [eng.add_request(sample_prompt(5 + i, 7, 300), GREEDY) for i in range(2)]
    while any(r.in_prompt for r in reqs):
        eng.step()
    graph = PassGraph(_Capture(eng.model), eng.caches, 2, 1, 256)
    assert graph.batch.lanes.writes is None
    graph._load(plan(*((r, 1) for r in reqs)))  # a plain pass loads
    reqs[1].lane.writes = reqs[
        0
    ].lane.slot  # any other slot: the check is the plan's, not its value
    with pytest.raises(ValueError, match="keeps each lane's state in its own slot"):
        graph._load(plan(*((r, 1) for r in reqs)))


@pytest.mark.parametrize(
    "values,want",
    [
        ([], []),
        ([7], [7]),
        ([3, -1, 2**40], [3, -1, 2**40]),  # a fed id still on the device is -1
        (([1, 2], range(5, 7)), [[1, 2], [5, 6]]),  # ids and positions
        (((0, 1, 2), (3, 4, 5)), [[0, 1, 2], [3, 4, 5]]),  # a Fed's rows and picks
    ],
)
def test_index_lists_become_int64_tensors(values, want):
    got = longs(values)
    assert got.dtype == torch.long and torch.equal(got, torch.tensor(want, dtype=torch.long))
    assert torch.equal(longs(values, "cpu"), got)  # on a device: the same values


def test_a_lone_tensor_is_joined_as_it_is_and_more_are_concatenated():
    """util.join: one tensor comes back itself (no copy, no launch on a GPU); several as
    torch.cat gives them."""
    a, b = torch.arange(3), torch.arange(3, 5)
    assert join([a]) is a
    assert torch.equal(join([a, b]), torch.arange(5))
