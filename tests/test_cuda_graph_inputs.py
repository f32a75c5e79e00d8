"""The decode graph's static inputs, checked on the CPU against the eager pass's batch: the same
tokens, positions, KV write rows, attention slot tables, state slots and conv gathers."""

import torch
from engine_util import make_engine, sample_prompt

from tensorfold.batch import Segment
from tensorfold.engine.request import SamplingParams, Watch
from tensorfold.ops.dispatch import lane_index
from tensorfold.runner.cuda_graph import DecodeGraph, is_decode_pass


class _Capture:
    """Stands in for the model: records the batch it is given."""

    def __init__(self, model):
        self.device, self.config, self.batch = model.device, model.config, None

    def forward(self, batch, caches):
        self.batch = batch
        return torch.zeros(batch.num_rows, 1)


def test_static_inputs_match_the_eager_batch(hf_tiny_b):
    eng = make_engine(hf_tiny_b, parallel=3, context=256)
    reqs = [
        eng.add_request(
            sample_prompt(90 + i, 5 + 9 * i, 300), SamplingParams(max_tokens=8, temperature=0)
        )
        for i in range(3)
    ]
    while any(r.in_prompt or not r.output_ids for r in reqs):
        eng.step()
    work = [(r, 1) for r in reqs]
    assert is_decode_pass(work)
    fake = _Capture(eng.model)
    graph = DecodeGraph(fake, eng.caches, 3, 256)
    graph._load(reqs)
    graph._forward()
    b, meta = fake.batch, fake.batch.lanes
    assert b.token_ids.tolist() == [r.all_ids[r.num_computed] for r in reqs]
    assert b.positions.tolist() == [r.num_computed for r in reqs]
    assert b.kv_write.tolist() == [int(r.kv_rows[r.num_computed]) for r in reqs]
    segs = [
        Segment(r.slot, r.num_computed, i, 1, r.kv_rows[: r.num_computed + 1])
        for i, r in enumerate(reqs)
    ]
    eager = lane_index(tuple(segs), "cpu", eng.model.config.conv_kernel)
    assert torch.equal(meta.slots, eager.slots) and torch.equal(meta.cu_seqlens, eager.cu_seqlens)
    assert torch.equal(meta.conv_taps, eager.conv_taps) and torch.equal(
        meta.conv_keep, eager.conv_keep
    )
    tiles, ref = meta.attention, eager.attention
    assert tiles.row0.tolist() == ref.row0.tolist() and tiles.pos0.tolist() == ref.pos0.tolist()
    for i, r in enumerate(reqs):  # each tile reads its lane's rows for positions 0..pos
        n = r.num_computed + 1
        base, ref_base = int(tiles.table_base[i]), int(ref.table_base[i])
        assert torch.equal(tiles.kv_rows[base : base + n], ref.kv_rows[ref_base : ref_base + n])


def test_graph_passes_are_one_row_per_lane_with_its_logits(hf_tiny_b):
    """The graph serves a pass where every lane feeds one row and needs that row's logits
    (Request.logit_rows); a watch keeping every logit row sees the same path as production."""
    eng = make_engine(hf_tiny_b)
    req = eng.add_request(sample_prompt(1, 10, 300), SamplingParams(max_tokens=2))
    kept = eng.add_request(
        sample_prompt(2, 10, 300), SamplingParams(max_tokens=2), watch=Watch(keep_logits=True)
    )
    assert not is_decode_pass([(req, 10)]) and not is_decode_pass([(kept, 10)])
    assert not is_decode_pass([(req, 1)])  # a prompt row whose logits nobody needs
    eng.step()
    assert is_decode_pass([(req, 1)]) and is_decode_pass([(req, 1), (kept, 1)])
