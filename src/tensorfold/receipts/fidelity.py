"""`check fidelity`: a teacher-forced judge against a reference history.

The history (scripts/reference_history.py: transformers or mlx_lm, greedy, eos ignored) holds
the reference's chosen token and top two logits at every step. We feed prompt + history in one
request, so every history token is forced, and read our top two at every history position. A
top-1 difference is allowed only under the tie policy (docs/exactness.md, 'Fidelity and near
ties': both engines' top two are the same two tokens, both margins within one bf16 spacing);
with --float64 our float64 replay may settle the rest: it ranks our token first, or it has the
same two contenders with a margin that our measured rounding (at that position) can flip.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .report import table, write_json

TIE, F64_OURS, F64_ROUNDING, UNEXPLAINED = (
    "tie",
    "float64 sides with us",
    "within our rounding",
    "UNEXPLAINED",
)


def bf16_spacing(x: float) -> float:
    """The gap between neighbouring bf16 values at x (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


@dataclass(frozen=True)
class Top2:
    first: int
    second: int
    first_logit: float
    second_logit: float

    @property
    def margin(self) -> float:
        return self.first_logit - self.second_logit

    @property
    def within_spacing(self) -> bool:
        return self.margin <= bf16_spacing(self.first_logit)

    @staticmethod
    def of(row: torch.Tensor) -> Top2:
        top = torch.topk(row, 2)
        return Top2(
            int(top.indices[0]), int(top.indices[1]), float(top.values[0]), float(top.values[1])
        )

    @staticmethod
    def of_step(step: dict) -> Top2:
        return Top2(
            int(step["top1"]),
            int(step["top2"]),
            float(step["top1_logit"]),
            float(step["top2_logit"]),
        )


def near_tie(ref: Top2, ours: Top2) -> bool:
    same = {ref.first, ref.second} == {ours.first, ours.second}
    return same and ref.within_spacing and ours.within_spacing


def arbitrate(ours: Top2, ours_row: torch.Tensor, exact_row: torch.Tensor) -> tuple[str, dict]:
    """The float64 verdict on one difference, and the float64 reading it rests on.

    Our rounding is measured on the rest of the row: the largest |ours - float64| among the
    logits other than the two contenders. (Their own error cannot be the measure: ranking two
    tokens the other way round than float64 already puts it above float64's margin.) A swap is
    explained when each contender moving by that much covers float64's margin."""
    f64 = Top2.of(exact_row)
    err = (ours_row.double() - exact_row).abs()
    pair = [ours.first, ours.second]
    others = err.clone()
    others[pair] = 0.0
    info = {
        "float64": [f64.first, f64.second],
        "float64_margin": f64.margin,
        "our_rounding": float(others.max()),
        "contenders_error": float(err[pair].sum()),
    }
    if f64.first == ours.first:
        return F64_OURS, info
    if {f64.first, f64.second} == set(pair) and f64.margin <= 2 * info["our_rounding"]:
        return F64_ROUNDING, info
    return UNEXPLAINED, info


class Teacher:
    """Our model, fed prompt + history in one request; logits kept at every position."""

    def __init__(self, checkpoint: Path, dtype: torch.dtype, device: torch.device) -> None:
        self.checkpoint, self.dtype, self.device = checkpoint, dtype, device
        self._model = None  # loaded on first use: the arbiter may not be

    def model(self):
        if self._model is None:
            from ..models.loader import load_model

            self._model = load_model(self.checkpoint, dtype=self.dtype, device=self.device)
        return self._model

    def logits(self, prompt_ids: list[int], steps: list[dict]) -> torch.Tensor:
        """[len(steps), V]: our logits before each history token (position pos - 1)."""
        from ..engine.engine import Engine, EngineConfig
        from ..engine.request import SamplingParams, Watch

        forced = prompt_ids + [int(s["token"]) for s in steps][:-1]
        engine = Engine(
            self.model(), None, EngineConfig(parallel=1, context=len(forced) + 8, chunk=128)
        )
        watch = Watch(keep_logits=True)
        engine.add_request(forced, SamplingParams(max_tokens=1, temperature=0.0), watch=watch)
        engine.run_until_done()
        return torch.stack([watch.logits[int(s["pos"]) - 1].float().cpu() for s in steps])


def judge_prompt(entry: dict, ours: torch.Tensor) -> list[dict]:
    """Every position where our top-1 differs from the reference's, judged by the tie policy."""
    diffs = []
    for i, step in enumerate(entry["steps"]):
        ref, mine = Top2.of_step(step), Top2.of(ours[i])
        if mine.first == ref.first:
            continue
        tie = near_tie(ref, mine)
        diffs.append(
            {
                "prompt": entry["name"],
                "step": i,
                "pos": int(step["pos"]),
                "reference": ref.__dict__,
                "ours": mine.__dict__,
                "tie": tie,
                "verdict": TIE if tie else UNEXPLAINED,
            }
        )
    return diffs


def apply_arbiter(diffs: list[dict], ours: torch.Tensor, exact: torch.Tensor) -> None:
    for d in diffs:
        if d["tie"]:
            continue
        mine = Top2(**d["ours"])
        d["verdict"], d["arbiter"] = arbitrate(mine, ours[d["step"]], exact[d["step"]])


@dataclass(frozen=True)
class FidelityConfig:
    checkpoint: Path
    history: Path
    dtype: torch.dtype
    device: torch.device
    float64: bool = False
    arbiter_device: torch.device = torch.device("cpu")


def run_fidelity(cfg: FidelityConfig) -> dict:
    history = json.loads(cfg.history.read_text())
    ours = Teacher(cfg.checkpoint, cfg.dtype, cfg.device)
    exact = Teacher(cfg.checkpoint, torch.float64, cfg.arbiter_device)
    prompts = []
    for entry in history["prompts"]:
        logits = ours.logits(entry["prompt_ids"], entry["steps"])
        diffs = judge_prompt(entry, logits)
        if cfg.float64 and any(not d["tie"] for d in diffs):
            apply_arbiter(diffs, logits, exact.logits(entry["prompt_ids"], entry["steps"]).double())
        prompts.append(
            {"name": entry["name"], "positions": len(entry["steps"]), "differences": diffs}
        )
    return {
        "tool": "check fidelity",
        "checkpoint": str(cfg.checkpoint),
        "history": str(cfg.history),
        "reference": history.get("backend"),
        "reference_dtype": history.get("dtype"),
        "dtype": str(cfg.dtype),
        "float64": cfg.float64,
        "prompts": prompts,
    }


def summary_table(result: dict) -> str:
    rows = []
    for p in result["prompts"]:
        diffs = p["differences"]
        beyond = sum(not d["tie"] for d in diffs)
        bad = sum(d["verdict"] == UNEXPLAINED for d in diffs)
        rows.append(
            [
                p["name"],
                p["positions"],
                p["positions"] - len(diffs),
                len(diffs),
                beyond,
                bad,
                "pass" if not bad else "FAIL",
            ]
        )
    return table(
        [
            "prompt",
            "positions",
            "top-1 equal",
            "differences",
            "beyond tie policy",
            "unexplained",
            "judge",
        ],
        rows,
    )


def _pair(t: dict) -> tuple[str, str, str]:
    return (
        f"{t['first']}, {t['second']}",
        f"{t['first_logit']:.6g} / {t['second_logit']:.6g}",
        f"{t['first_logit'] - t['second_logit']:.6g}",
    )


def differences_table(result: dict) -> str:
    rows = []
    for p in result["prompts"]:
        for d in p["differences"]:
            arb = d.get("arbiter", {})
            f64 = (
                (
                    f"{arb['float64'][0]}, {arb['float64'][1]} ({arb['float64_margin']:.3g}; "
                    f"ours ±{arb['our_rounding']:.3g})"
                )
                if arb
                else "-"
            )
            rows.append(
                [
                    d["prompt"],
                    d["pos"],
                    *_pair(d["reference"]),
                    *_pair(d["ours"]),
                    f64,
                    d["verdict"],
                ]
            )
    return table(
        [
            "prompt",
            "pos",
            "reference top 2",
            "logits",
            "margin",
            "our top 2",
            "logits",
            "margin",
            "float64 top 2 (margin)",
            "verdict",
        ],
        rows,
    )


def fidelity_command(cfg: FidelityConfig, output: str | None) -> int:
    result = run_fidelity(cfg)
    print(summary_table(result))
    if any(p["differences"] for p in result["prompts"]):
        print()
        print(differences_table(result))
    write_json(output, result)
    bad = sum(d["verdict"] == UNEXPLAINED for p in result["prompts"] for d in p["differences"])
    total = sum(p["positions"] for p in result["prompts"])
    print(
        f"check fidelity: {'PASS' if not bad else 'FAIL'} ({total} positions, "
        f"{bad} differences unexplained)"
    )
    return 1 if bad else 0
