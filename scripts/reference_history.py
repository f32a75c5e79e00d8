"""The reference history for `tensorfold check fidelity`: the four fixed prompts (copy,
arithmetic, story, code) rendered with the checkpoint's chat template (thinking off), greedy-decoded
by transformers or mlx_lm with eos ignored, with the chosen token and the top two logits at
every step.

    PYTHONPATH=src python scripts/reference_history.py CHECKPOINT --out H.json --tokens 256 \
        [--backend transformers|mlx] [--dtype float32|bfloat16|float64] [--prompts copy,code]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tensorfold.receipts.prompts import FIDELITY_PROMPTS, pick
from tensorfold.tokenizer import Tokenizer


def step_record(pos: int, token: int, logits: np.ndarray) -> dict[str, Any]:
    """pos: index of the generated token in prompt + output; top1 is the first argmax."""
    top1 = int(np.argmax(logits))
    others = logits.copy()
    others[top1] = -np.inf
    top2 = int(np.argmax(others))
    return {
        "pos": pos,
        "token": token,
        "top1": top1,
        "top1_logit": float(logits[top1]),
        "top2": top2,
        "top2_logit": float(logits[top2]),
    }


def load_transformers(path: Path, dtype_name: str, device: str):
    import torch
    import transformers as tf

    model_type = json.loads((path / "config.json").read_text())["model_type"]
    cls = tf.Qwen3_5ForConditionalGeneration if model_type == "qwen3_5" else tf.Qwen3_5ForCausalLM
    model = cls.from_pretrained(
        str(path), dtype=getattr(torch, dtype_name), attn_implementation="eager"
    ).to(device)
    # A blank generation config: the checkpoint's eos list and sampling defaults must not apply.
    model.generation_config = tf.GenerationConfig()
    return model.eval()


def transformers_steps(model, prompt_ids: list[int], n: int) -> list[dict[str, Any]]:
    import torch
    from transformers import GenerationConfig

    ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=n,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    chosen = out.sequences[0, len(prompt_ids) :].tolist()
    return [
        step_record(len(prompt_ids) + i, int(t), out.logits[i][0].float().cpu().numpy())
        for i, t in enumerate(chosen)
    ]


def load_mlx(path: Path, activations: str):
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm import load

    model, _tokenizer = load(str(path))
    if activations == "float32":  # same packed weights, float32 activations
        model.update(
            tree_map(
                lambda x: x.astype(mx.float32) if x.dtype == mx.bfloat16 else x, model.parameters()
            )
        )
    return model


def mlx_steps(model, prompt_ids: list[int], n: int) -> list[dict[str, Any]]:
    """mlx_lm's own generate_step; a logits processor sees each step's raw logits."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    captured: list = []

    def capture(_tokens, logits):
        captured.append(logits)
        return logits

    prompt = mx.array(prompt_ids, dtype=mx.uint32)
    steps = generate_step(prompt, model, max_tokens=n, logits_processors=[capture])
    return [
        step_record(
            len(prompt_ids) + i, int(token), np.array(captured[i].astype(mx.float32).reshape(-1))
        )
        for i, (token, _logprobs) in enumerate(steps)
    ]


def history(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.checkpoint)
    tok = Tokenizer(path)
    if args.backend == "mlx":
        model, run, dtype = load_mlx(path, args.dtype), mlx_steps, args.dtype
    else:
        model, run, dtype = (
            load_transformers(path, args.dtype, args.device),
            transformers_steps,
            args.dtype,
        )
    prompts = []
    for p in pick(FIDELITY_PROMPTS, args.prompts):
        ids = tok.chat([{"role": "user", "content": p.text}], enable_thinking=False)
        prompts.append(
            {
                "name": p.name,
                "text": p.text,
                "prompt_ids": ids,
                "steps": run(model, ids, args.tokens),
            }
        )
    return {
        "checkpoint": str(path),
        "backend": args.backend,
        "dtype": dtype,
        "tokens": args.tokens,
        "prompts": prompts,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--backend", default="transformers", choices=["transformers", "mlx"])
    p.add_argument(
        "--dtype",
        default=None,
        help="transformers: float32 (default), bfloat16, float64; "
        "mlx activations: bfloat16 (default, as mlx_lm runs) or float32",
    )
    p.add_argument("--prompts", default=None, help="comma list (default: all four)")
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="transformers: where the model runs (auto: cuda when present; transformers "
        "runs Qwen3.5's GDN through fla's kernels where fla is installed, and those "
        "take CUDA tensors only)",
    )
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bfloat16" if args.backend == "mlx" else "float32"
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    allowed = (
        ("bfloat16", "float32") if args.backend == "mlx" else ("float32", "bfloat16", "float64")
    )
    if args.dtype not in allowed:
        p.error(f"--dtype {args.dtype} with --backend {args.backend}: choose {', '.join(allowed)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    data = history(args)
    Path(args.out).write_text(json.dumps(data) + "\n")
    for p in data["prompts"]:
        print(f"{p['name']}: {len(p['prompt_ids'])} prompt tokens, {len(p['steps'])} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
