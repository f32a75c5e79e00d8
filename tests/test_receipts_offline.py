"""The offline receipts: `check fidelity` (teacher-forced judge of a reference history made by
scripts/reference_history.py) and `check attention-precision` (kernel against float64)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import tensorfold.ops.attention as cpu_attention
from tensorfold.cli import main
from tensorfold.receipts.fidelity import (
    F64_OURS,
    F64_ROUNDING,
    UNEXPLAINED,
    Top2,
    arbitrate,
    bf16_spacing,
    near_tie,
)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reference_history.py"


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def reference_history(checkpoint: Path, out: Path, *extra: str) -> Path:
    spec = importlib.util.spec_from_file_location("reference_history", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (
        script.main([str(checkpoint), "--out", str(out), "--prompts", "arithmetic,code", *extra])
        == 0
    )
    return out


@pytest.fixture(scope="module")
def history(hf_tiny, tmp_path_factory) -> Path:
    return reference_history(
        hf_tiny, tmp_path_factory.mktemp("history") / "h.json", "--tokens", "12"
    )


def test_the_history_holds_greedy_steps_with_top_two(history):
    data = json.loads(history.read_text())
    assert data["backend"] == "transformers" and data["dtype"] == "float32"
    assert [p["name"] for p in data["prompts"]] == ["arithmetic", "code"]
    for p in data["prompts"]:
        steps = p["steps"]
        assert [s["pos"] for s in steps] == list(
            range(len(p["prompt_ids"]), len(p["prompt_ids"]) + 12)
        )
        assert all(s["token"] == s["top1"] != s["top2"] for s in steps)  # greedy
        assert all(s["top1_logit"] >= s["top2_logit"] for s in steps)


def test_fidelity_passes_against_transformers_float32(hf_tiny, history, capsys, tmp_path):
    out = tmp_path / "fidelity.json"
    code, text = run(
        capsys,
        "check",
        "fidelity",
        str(hf_tiny),
        "--history",
        str(history),
        "--dtype",
        "float32",
        "--output",
        str(out),
    )
    assert code == 0, text
    assert "check fidelity: PASS (24 positions, 0 differences unexplained)" in text
    prompts = json.loads(out.read_text())["prompts"]
    assert [p["positions"] for p in prompts] == [12, 12]


def _doctored(history: Path, tmp_path: Path) -> tuple[Path, int]:
    """The history with one confident top-1 moved to another token: a non-tie difference."""
    data = json.loads(history.read_text())
    steps = data["prompts"][0]["steps"]
    step = max(steps, key=lambda s: s["top1_logit"] - s["top2_logit"])
    planted = next(t for t in range(10) if t not in (step["top1"], step["top2"]))
    step["top1"], step["top1_logit"] = planted, step["top1_logit"] + 5.0
    out = tmp_path / "doctored.json"
    out.write_text(json.dumps(data))
    return out, step["pos"]


def test_fidelity_fails_on_a_planted_non_tie_difference(hf_tiny, history, capsys, tmp_path):
    doctored, pos = _doctored(history, tmp_path)
    code, text = run(
        capsys, "check", "fidelity", str(hf_tiny), "--history", str(doctored), "--dtype", "float32"
    )
    assert code == 1
    row = next(line for line in text.splitlines() if line.endswith(UNEXPLAINED))
    assert row.split()[:2] == ["arithmetic", str(pos)]
    assert "check fidelity: FAIL (24 positions, 1 differences unexplained)" in text


def test_float64_arbiter_sides_with_us_on_the_planted_difference(
    hf_tiny, history, capsys, tmp_path
):
    doctored, _pos = _doctored(history, tmp_path)
    code, text = run(
        capsys,
        "check",
        "fidelity",
        str(hf_tiny),
        "--history",
        str(doctored),
        "--dtype",
        "float32",
        "--float64",
    )
    assert code == 0, text
    assert any(line.endswith(F64_OURS) for line in text.splitlines())


def test_mlx_history_judged_with_the_float64_arbiter(mlx_q8_g32, capsys, tmp_path):
    """mlx_lm in bf16 on the CPU is noisy; what the tie policy leaves, float64 must settle."""
    h = reference_history(mlx_q8_g32, tmp_path / "mlx.json", "--backend", "mlx", "--tokens", "8")
    data = json.loads(h.read_text())
    assert (data["backend"], data["dtype"]) == ("mlx", "bfloat16")
    code, text = run(
        capsys,
        "check",
        "fidelity",
        str(mlx_q8_g32),
        "--history",
        str(h),
        "--dtype",
        "bfloat16",
        "--float64",
    )
    assert code == 0, text
    assert "check fidelity: PASS (16 positions, 0 differences unexplained)" in text


def test_tie_policy_and_bf16_spacing():
    assert bf16_spacing(1.0) == 2**-7 and bf16_spacing(9.75) == 2**-4
    assert bf16_spacing(-20.0) == 2**-3
    ref = Top2(5, 7, 9.75, 9.75)
    assert near_tie(ref, Top2(7, 5, 9.75, 9.6875))
    assert not near_tie(ref, Top2(7, 5, 9.75, 9.625))  # our margin is two spacings
    assert not near_tie(ref, Top2(7, 9, 9.75, 9.75))  # another runner-up
    assert not near_tie(Top2(5, 7, 9.875, 9.75), Top2(7, 5, 9.75, 9.75))


def test_arbiter_verdicts():
    ours_row = torch.zeros(10)
    ours_row[7], ours_row[5] = 3.0, 2.9
    ours = Top2.of(ours_row)

    def exact(**logits: float) -> torch.Tensor:
        row = torch.full((10,), 0.05, dtype=torch.float64)  # our rounding elsewhere: 0.05
        for k, v in logits.items():
            row[int(k[1:])] = v
        return row

    assert arbitrate(ours, ours_row, exact(t7=3.0, t5=2.0))[0] == F64_OURS
    # float64 ranks 5 first by 0.08: two contenders each 0.05 off can flip that.
    verdict, info = arbitrate(ours, ours_row, exact(t7=2.9, t5=2.98))
    assert verdict == F64_ROUNDING and info["our_rounding"] == pytest.approx(0.05)
    assert arbitrate(ours, ours_row, exact(t7=2.9, t5=3.01))[0] == UNEXPLAINED  # 0.11 > 0.1
    assert arbitrate(ours, ours_row, exact(t7=2.95, t5=2.96, t9=4.0))[0] == UNEXPLAINED


PRECISION = (
    "check",
    "attention-precision",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--head-dim",
    "64",
    "--length",
    "256",
    "--rows",
    "128",
    "--samples",
    "16",
    "--device",
    "cpu",
)


@pytest.mark.parametrize("path", ["decode", "prompt"])
def test_attention_precision_reports_errors_by_row_range(path, capsys, tmp_path):
    out = tmp_path / "precision.json"
    extra = ("--prompt",) if path == "prompt" else ()
    code, text = run(capsys, *PRECISION, *extra, "--output", str(out))
    assert code == 0, text
    records = json.loads(out.read_text())["records"]
    assert [(r["queries"], r["rows"]) for r in records] == [
        (1.0, [0, 128]),
        (1.0, [128, 256]),
        (4.0, [0, 128]),
        (4.0, [128, 256]),
    ]
    rows = 64 if path == "prompt" else 16  # a prompt range is measured in whole 64-row tiles
    for r in records:
        assert r["path"] == path and r["measured_rows"] == rows and r["non_finite"] == 0
        assert 0 < r["mean_err"] <= r["max_err"] < 1e-5  # float32 arithmetic on bf16 rows
    assert sum(line.startswith(path) for line in text.splitlines()) == 4


def test_attention_precision_in_bf16_is_bounded_by_output_rounding(capsys, tmp_path):
    out = tmp_path / "precision.json"
    code, _text = run(capsys, *PRECISION, "--dtype", "bfloat16", "--output", str(out))
    assert code == 0
    worst = max(r["max_err"] for r in json.loads(out.read_text())["records"])
    assert 1e-5 < worst < 2**-6  # bf16 outputs of values below 4


def _planted(change):
    real = cpu_attention.paged_attention

    def kernel(q, *args):
        out = real(q, *args).clone()
        change(out)
        return out

    return kernel


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda out: out[0, 0, 0].fill_(float("nan")), "non-finite"),
        (lambda out: out[0, 1].add_(0.05), "error"),
    ],
)
def test_attention_precision_fails_on_a_planted_kernel_fault(
    change, problem, monkeypatch, capsys, tmp_path
):
    monkeypatch.setattr(cpu_attention, "paged_attention", _planted(change))
    out = tmp_path / "precision.json"
    code, text = run(capsys, *PRECISION, "--output", str(out))
    assert code == 1
    records = json.loads(out.read_text())["records"]
    if problem == "non-finite":
        assert all(r["non_finite"] >= 1 for r in records)
    else:
        assert all(r["max_err"] >= 0.04 for r in records)
    assert "check attention-precision: FAIL" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_attention_precision_of_the_triton_kernel(capsys):
    code, text = run(
        capsys,
        "check",
        "attention-precision",
        "--heads",
        "16",
        "--kv-heads",
        "4",
        "--length",
        "4096",
        "--rows",
        "2048",
        "--device",
        "cuda",
    )
    assert code == 0, text
