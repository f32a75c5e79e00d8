"""Fidelity against the reference implementations on the same files.

HF-layout files: transformers in float32 (and float64) — logits at every prompt position within a
measured bound, 64 greedy tokens equal. MLX files: mlx_lm's greedy history, teacher-forced into our
bf16 engine; every top-1 difference must be a near tie (docs/exactness.md, 'Fidelity and near
ties'), and our float64 mode arbitrates.
"""

import pytest
import torch
from engine_util import generate, make_engine, position_logits, sample_prompt
from fixtures.checkpoints import hf_forward_logits, hf_greedy, mlx_teacher_forced

from tensorfold.engine.request import SamplingParams
from tensorfold.receipts.fidelity import UNEXPLAINED, Top2, arbitrate, near_tie

# Measured: max |ours - HF| / max |HF| was 1.1e-5 to 1.8e-5 in float32 over 80 positions (HF's
# prompt path uses the chunked GDN form, ours the per-token recurrence). In float64 the gap stays
# 1.4e-5: transformers builds its rotary angles in float32 even in a float64 model, so it is no
# float64 arbiter; the check is that our float64 mode agrees at that level.
FP32_REL_BOUND = 5e-5
FP64_REL_BOUND = 5e-5
HF_FIXTURES = ["hf_tiny", "hf_tiny_nested", "hf_tiny_b", "hf_tiny_c"]


@pytest.mark.parametrize("name", HF_FIXTURES)
def test_logits_match_transformers_fp32(name, request):
    path = request.getfixturevalue(name)
    ids = sample_prompt(3, 80, 300)
    ours = position_logits(make_engine(path), ids)
    ref = hf_forward_logits(path, ids)
    rel = float((ours - ref).abs().max() / ref.abs().max())
    assert rel < FP32_REL_BOUND, rel
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_logits_match_transformers_fp64(hf_tiny_b):
    ids = sample_prompt(4, 48, 300)
    ours = position_logits(make_engine(hf_tiny_b, dtype=torch.float64), ids)
    ref = hf_forward_logits(hf_tiny_b, ids, dtype=torch.float64)
    rel = float((ours - ref.double()).abs().max() / ref.abs().max())
    assert rel < FP64_REL_BOUND, rel


@pytest.mark.parametrize("name", ["hf_tiny", "hf_tiny_b"])
def test_64_greedy_tokens_equal_transformers(name, request):
    path = request.getfixturevalue(name)
    ids = sample_prompt(5, 20, 300)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    assert generate(make_engine(path), ids, params) == hf_greedy(path, ids, 64)


def judge(history, ours: torch.Tensor, f64: torch.Tensor) -> list[dict]:
    """Positions where top-1 differs from mlx_lm's, each with the tie verdict and float64's."""
    diffs = []
    for step in history:
        row = ours[step["pos"] - 1].float()
        mine, ref = Top2.of(row), Top2.of_step(step)
        if mine.first == ref.first:
            continue
        verdict, info = arbitrate(mine, row, f64[step["pos"] - 1])
        diffs.append(
            {
                "pos": step["pos"],
                "mlx": (ref.first, ref.second),
                "ours": (mine.first, mine.second),
                "tie": near_tie(ref, mine),
                "verdict": verdict,
                **info,
            }
        )
    return diffs


MLX_FIXTURES = ["mlx_q4", "mlx_q8_g32", "mlx_mixed"]


def _forced(path, activations, dtype):
    prompt = sample_prompt(6, 24, 300)
    history = mlx_teacher_forced(path, prompt, 48, activations=activations)
    forced = prompt + [s["token"] for s in history]
    ours = position_logits(make_engine(path, dtype=dtype), forced)
    f64 = position_logits(make_engine(path, dtype=torch.float64), forced)
    return history, judge(history, ours, f64)


@pytest.mark.parametrize("name", MLX_FIXTURES)
def test_teacher_forced_against_mlx_lm_float32(name, request):
    """mlx_lm reading the same file with float32 activations: every difference a near tie."""
    history, diffs = _forced(request.getfixturevalue(name), "float32", torch.float32)
    assert all(d["tie"] for d in diffs), diffs
    assert len(diffs) <= len(history) // 10


@pytest.mark.parametrize("name", MLX_FIXTURES)
def test_teacher_forced_against_mlx_lm_bf16_with_float64_arbiter(name, request):
    """mlx_lm as it runs by default: bf16 on the CPU, whose quantized products are a few percent off
    (its logits moved up to 1.26 from float64 here, ours 0.38). A difference beyond the tie policy
    must be settled by float64: it sides with us, or it has the same two contenders with a margin
    within twice our rounding measured on the rest of that row (receipts.fidelity.arbitrate)."""
    history, diffs = _forced(request.getfixturevalue(name), "bfloat16", torch.bfloat16)
    assert [d for d in diffs if not d["tie"] and d["verdict"] == UNEXPLAINED] == []
    assert len(diffs) <= len(history) // 4, diffs
