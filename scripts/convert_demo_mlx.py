"""Make the demo's MLX 4-bit (group 64) files from its bf16 checkpoint with mlx_lm, then check
them: greedy mlx_lm replies to every known-answer prompt, thinking on and off, and the size
budget of the two shipped folders.

    PYTHONPATH=src python scripts/convert_demo_mlx.py [--src DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tensorfold.demo.data import KNOWN_ANSWERS, Sample
from tensorfold.demo.mlx import convert_to_mlx

DEMO = Path(__file__).resolve().parents[1] / "src" / "tensorfold" / "demo"
SIZE_BUDGET = 25_000_000  # bytes, bf16 + MLX folders together

CARD = """---
language: en
library_name: mlx
pipeline_tag: text-generation
tags: [mlx, qwen3_5]
---
The TensorFold demo model quantized by `mlx_lm.convert` to 4 bits (affine, group size 64):
see `../README.md` for the model card and `scripts/convert_demo_mlx.py` to rebuild it.
"""


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def greedy_reply(model, tokenizer, prompt_ids: list[int]) -> str:
    from mlx_lm import stream_generate

    # stream_generate stops at generation_config's eos ids and does not yield them.
    tokens = [
        r.token
        for r in stream_generate(model, tokenizer, prompt_ids, max_tokens=128)
        if r.finish_reason is None
    ]
    return tokenizer.decode(tokens, skip_special_tokens=False)


def check_known_answers(mlx_dir: Path) -> int:
    """Prints one line per prompt and mode; returns how many answers were wrong."""
    from mlx_lm import load

    model, tokenizer = load(str(mlx_dir))
    wrong = 0
    for task in KNOWN_ANSWERS:
        for thinking in (True, False):
            messages = [{"role": "user", "content": task.prompt}]
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, enable_thinking=thinking
            )
            sample = Sample(task, thinking)
            assert tokenizer.decode(ids, skip_special_tokens=False) == sample.prompt_text()
            got = greedy_reply(model, tokenizer, ids)
            ok = got.split("</think>\n\n")[-1] == task.answer
            wrong += not ok
            mode = "think" if thinking else "no-think"
            print(f"{'ok ' if ok else 'BAD'} [{mode}] {task.prompt!r} -> {got!r}")
    return wrong


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, default=DEMO / "bf16")
    p.add_argument("--out", type=Path, default=DEMO / "mlx-4bit")
    args = p.parse_args()
    out = convert_to_mlx(args.src, args.out, bits=4, group_size=64)
    (out / "README.md").write_text(CARD)
    wrong = check_known_answers(out)
    sizes = {d.name: folder_bytes(d) for d in (args.src, out)}
    total = sum(sizes.values())
    print(f"sizes: {sizes}, together {total:,} bytes (budget {SIZE_BUDGET:,})")
    print(f"known answers: {2 * len(KNOWN_ANSWERS) - wrong}/{2 * len(KNOWN_ANSWERS)} right")
    return 1 if wrong or total > SIZE_BUDGET else 0


if __name__ == "__main__":
    sys.exit(main())
