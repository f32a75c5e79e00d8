"""The shared expert run as one more expert of the grouped launches (`join_shared_experts`, done
at load for a whole model): the routed stacks with the shared expert's SwiGLU appended as expert
E, every row choosing it last. On the CPU the logits are the separate launches' bits,
concurrent = solo holds, the routed experts are views of the joint stacks (the shared expert's
bytes counted once more), and a file whose shared expert is in another format than the stacks
keeps its own launches."""

import pytest
import torch
from engine_util import make_engine, position_logits, sample_prompt

from tensorfold.engine.request import SamplingParams
from tensorfold.layers.moe import SparseMoE

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _moes(engine) -> list[SparseMoE]:
    return [layer.mlp for layer in engine.model.layers if isinstance(layer.mlp, SparseMoE)]


@pytest.mark.parametrize("name", ["hf_moe_fused", "mlx_moe_q4"])
def test_joint_shared_expert_gives_the_separate_bits(name, request):
    path = request.getfixturevalue(name)
    plain, joint = make_engine(path, parallel=3), make_engine(path, parallel=3)
    plain.model.separate_shared_experts()
    assert all(moe.joint is None for moe in _moes(plain))
    assert joint.model.join_shared_experts() == len(_moes(joint)) > 0  # joined at load already
    shared = sum(
        w.nbytes if hasattr(w, "rows") else w.numel() * w.element_size()
        for moe in _moes(joint)
        for w in (
            moe.shared.gate_proj.weight,
            moe.shared.up_proj.weight,
            moe.shared.down_proj.weight,
        )
    )
    moes = _moes(joint)  # the joint stacks hold the shared expert once more, and are counted
    assert sum(m.appended.nbytes for m in moes) == sum(m.experts.nbytes for m in moes) + shared
    assert joint.model.weight_bytes == plain.model.weight_bytes  # separated, it holds them still
    for moe in _moes(joint):
        e = moe.experts.num_experts
        assert moe.joint.num_experts == e + 1
        assert moe.experts.down.weight.data_ptr() == moe.joint.down.weight.data_ptr()
        assert torch.equal(_rows(moe.joint.down.expert(e)), _rows(moe.shared.down_proj.weight))
    ids = sample_prompt(11, 45, 200)
    assert torch.equal(position_logits(joint, ids), position_logits(plain, ids))
    prompts = [sample_prompt(20 + i, 9 + 13 * i, 200) for i in range(3)]
    reqs = [joint.add_request(p, GREEDY) for p in prompts]
    joint.run_until_done()
    for p, r in zip(prompts, reqs):
        alone = plain.add_request(p, GREEDY)
        plain.run_until_done()
        assert r.output_ids == alone.output_ids


def _rows(w) -> torch.Tensor:
    """A projection's first rows in fp32, packed or dense."""
    return w.rows(0, 4, torch.float32) if hasattr(w, "rows") else w[:4].float()


def test_a_shared_expert_in_another_format_keeps_its_launches(mlx_moe_mixed):
    """Experts' up at 3 bits, the shared expert's at 4: not one stack, so no layer joins."""
    eng = make_engine(mlx_moe_mixed, parallel=1)
    assert eng.model.join_shared_experts() == 0  # at load, and when asked again
    assert all(moe.joint is None for moe in _moes(eng))


def test_with_shared_takes_only_the_stacks_format():
    """The shared expert joins only in the stacks' own format and shape: dense of the same dtype,
    or packed at the same bits, group and scale dtype; anything else keeps its launches."""
    from tensorfold.ops.moe import Experts, ExpertStack, routed_part, with_shared
    from tensorfold.ops.quant import QuantizedWeight, quantize

    dense = Experts(*(ExpertStack(torch.randn(3, n, k)) for n, k in ((8, 32), (8, 32), (32, 8))))
    own = [torch.randn(n, k) for n, k in ((8, 32), (8, 32), (32, 8))]
    joint = with_shared(dense, *own)
    assert joint.num_experts == 4 and torch.equal(joint.down.expert(3), own[2])
    assert torch.equal(routed_part(joint).gate.weight, dense.gate.weight)
    assert with_shared(dense, own[0], own[1], torch.randn(16, 8)) is None  # another width
    assert with_shared(dense, own[0].half(), *own[1:]) is None  # another dtype
    words, s, b = quantize(torch.randn(8, 64), 4, 32)
    packed = ExpertStack(words[None], s[None], b[None], 4, 32)
    q = QuantizedWeight(words, s, b, 4, 32)
    assert with_shared(Experts(packed, packed, packed), q, q, q).num_experts == 2
    eight = QuantizedWeight(*quantize(torch.randn(8, 64), 8, 32), 8, 32)
    assert with_shared(Experts(packed, packed, packed), q, q, eight) is None  # 8 bits, not 4
    half = QuantizedWeight(words, s.half(), b.half(), 4, 32)
    assert with_shared(Experts(packed, packed, packed), q, q, half) is None  # fp16 scales
    assert with_shared(dense, q, *own[1:]) is None  # packed beside dense


def test_passes_of_many_rows_run_the_shared_expert_in_its_own_launches(hf_moe_fused, monkeypatch):
    """Past JOINT_ROWS rows (prompt-sized passes) the joined layer runs the shared expert through
    its own launches, the same bits; passes of fewer rows run it in the grouped launches."""
    from tensorfold.layers import moe as moe_layer
    from tensorfold.layers.mlp import MLP

    monkeypatch.setattr(moe_layer, "JOINT_ROWS", 40)
    own, call = [], MLP.__call__
    monkeypatch.setattr(
        MLP, "__call__", lambda self, x, *a, **k: own.append(x.shape[0]) or call(self, x, *a, **k)
    )
    plain, joint = make_engine(hf_moe_fused, parallel=3), make_engine(hf_moe_fused, parallel=3)
    plain.model.separate_shared_experts()
    ids = sample_prompt(12, 100, 200)
    want = position_logits(plain, ids)
    own.clear()
    assert torch.equal(position_logits(joint, ids), want)
    assert own and min(own) > 40  # the 100-row pass: its own launches, every MoE layer
    own.clear()
    prompts = [sample_prompt(30 + i, 5 + i, 200) for i in range(3)]
    reqs = [joint.add_request(p, GREEDY) for p in prompts]
    joint.run_until_done()
    assert not own  # passes of at most 40 rows: the grouped launches
    for p, r in zip(prompts, reqs):
        alone = plain.add_request(p, GREEDY)
        plain.run_until_done()
        assert r.output_ids == alone.output_ids
