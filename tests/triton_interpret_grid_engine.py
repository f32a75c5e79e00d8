"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): a tiny model's engine with the
grid form's Triton kernel (or the rows form's: triton_interpret_rows_engine.py) in every Gated
DeltaNet layer, on the CPU in fp32 (the op dispatches to the kernel as a GPU pass would: the
engine's lanes, tails, pools and arrival counts). Bitwise:
decode = prefill logits, any prompt chunking, concurrent = solo tokens, drafted = plain (some
drafts rejected); and close to the chunk form's reference engine."""

import tempfile
from pathlib import Path

import interpreter_dot
import torch
from drafting_util import Script
from engine_util import decoded_logits, make_engine, position_logits, sample_prompt
from fixtures.checkpoints import HF_VARIANTS, build_hf_checkpoint

from tensorfold.drafters.gate import PassPrices
from tensorfold.engine.request import SamplingParams
from tensorfold.ops import dispatch
from tensorfold.ops.triton.gated_delta_grid import grid_lanes
from tensorfold.ops.triton.gated_delta_rows import rows_lanes

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def kernel_for_forms() -> None:
    """ops.dispatch.gated_delta runs our kernels for the grid and rows forms on CPU tensors too."""
    reference = dispatch.gated_delta
    kernels = {"grid": grid_lanes, "rows": rows_lanes}

    def gated_delta(x, gates, states, shape, batch, form="recurrence"):
        if form in kernels:
            return kernels[form](x, *gates, states, shape, batch.lanes)
        return reference(x, gates, states, shape, batch, form)

    dispatch.gated_delta = gated_delta


def tokens(eng, prompts):
    reqs = [eng.add_request(p, GREEDY) for p in prompts]
    eng.run_until_done()
    return [r.output_ids for r in reqs]


def main(form: str = "grid", every: bool = True) -> None:
    """`every` False: decode = prefill and the chunk reference only (the kernel's own checks cover
    cuts, lanes and several-row passes; the suite's time is kept for the other checks)."""
    interpreter_dot.install()
    kernel_for_forms()
    spec, kwargs = HF_VARIANTS["hf_tiny_c"]  # GDN 4 key heads → 8 value heads, dk 16, dv 32
    path = build_hf_checkpoint(Path(tempfile.mkdtemp()) / "hf_tiny_c", spec, **kwargs)
    grid = lambda **c: make_engine(path, gdn_form=form, **c)  # noqa: E731
    ids = sample_prompt(3, 70, 300)
    req, decoded = decoded_logits(grid(), ids, GREEDY)
    full = ids + req.output_ids[:-1]
    prefilled = position_logits(grid(), full)
    assert torch.equal(decoded, prefilled[len(ids) :]), "decode rows differ from prompt rows"
    chunk = position_logits(make_engine(path, gdn_form="chunk"), full)
    err = float((prefilled - chunk).abs().max() / chunk.abs().max())
    assert err < 1e-3, err  # the same rule, rounded by the kernel's order
    if not every:
        print(f"{form} engine equals itself across passes and lanes")
        return
    prompts = [sample_prompt(10 + i, n, 300) for i, n in enumerate((5, 62))]
    solo = [tokens(grid(parallel=1), [p])[0] for p in prompts]
    assert tokens(grid(parallel=2), prompts) == solo, "concurrent differs from solo"
    assert torch.equal(position_logits(grid(chunk=37), full), prefilled), "chunks of 37 differ"
    # verify passes of several rows a lane, a boundary crossed inside one, drafts rejected
    # every verify priced as a plain pass: under the interpreter a verify's rows cost many
    # plain passes' time, and a priced gate would stop drafting
    PassPrices.ratio = lambda self, lanes, rows: 1.0
    PassPrices.plain_measured = lambda self: True
    drafted = grid(parallel=2, draft="ngram", prompt_cache_bytes=1 << 24)
    replies = {tuple(p): out for p, out in zip(prompts, solo)}
    drafted.drafting.default = Script(replies, wrong=lambda p: p % 3 == 2)
    assert tokens(drafted, prompts) == solo, "drafted differs from plain"
    assert 0 < drafted.drafting.stats.accepted < drafted.drafting.stats.proposed
    print(f"{form} engine equals itself across passes and lanes")


if __name__ == "__main__":
    main()
