"""What DFlash2 drafters (z-lab `DFlash2DraftModel`) add to DFlash (models/dflash.py); docs/model.md,
'DFlash drafters'.

- Grouped dynamic causal convolutions, one around each layer's attention and one around its MLP.
  Along the block's positions t, channel c of group g:
      y_t[c] = sum_{j < K} (base[j][c] + dyn_t[j, g]) * x_{t-j}[c]     (x before the anchor = 0)
  dyn = kernel_projection(u), u the normed input of the sublayer, as [2, K, groups]: side 0 with
  base_kernel[0] convolves u before the sublayer, side 1 with base_kernel[1] its output after.
  The context is not convolved and nothing carries over between rounds.
- A candidate selector: the top_k tokens of each drafted row, then a walk from the anchor, left
  to right: score(v) = logit(v) + <pred[prev] * (P h_i), succ[v]>, the best v becomes prev.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import NotStockDrafter
from ..layers.linear import Linear

PAIRS = (("conv_kernel_size", "conv_group_size"), ("selector_rank", "selector_top_k"))
CODEBOOKS = ("predecessor_codebook", "successor_codebook")


@dataclass(frozen=True)
class DFlash2Fields:
    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int


def read_fields(raw: dict, path) -> DFlash2Fields:
    """The four DFlash2 fields (dflash_config first, then top level, as the reference reads them),
    each pair given together, positive, and a shape we can run (NotStockDrafter otherwise)."""
    d = raw.get("dflash_config") or {}
    got = {k: d.get(k, raw.get(k)) for pair in PAIRS for k in pair}
    for a, b in PAIRS:
        if (got[a] is None) != (got[b] is None):
            have, miss = (a, b) if got[b] is None else (b, a)
            raise NotStockDrafter(f"{path}: {have} without {miss}; a DFlash2 drafter sets both")
        if got[a] is None:
            raise NotStockDrafter(f"{path}: DFlash2DraftModel without {a} and {b}")
    bad = [k for k, v in got.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad:
        raise NotStockDrafter(f"{path}: {bad} must be positive integers")
    f = DFlash2Fields(**got)
    hidden, vocab = int(raw["hidden_size"]), int(raw["vocab_size"])
    if hidden % f.conv_group_size:
        raise NotStockDrafter(
            f"{path}: conv_group_size {f.conv_group_size} does not divide hidden_size {hidden}"
        )
    if f.selector_top_k > vocab:
        raise NotStockDrafter(f"{path}: selector_top_k {f.selector_top_k} > vocab_size {vocab}")
    return f


def codebook_name(stem: str, names) -> str:
    """The file's name of a codebook: published bare, `.weight` after a module-style export."""
    bare = f"candidate_selector.{stem}"
    return bare if bare in names or bare + ".weight" not in names else bare + ".weight"


def dflash2_shapes(f: DFlash2Fields, hidden: int, vocab: int, layers: int, names=()) -> dict:
    groups = hidden // f.conv_group_size
    shapes = {
        "candidate_selector.hidden_projection.weight": (f.selector_rank, hidden),
        **{codebook_name(s, names): (vocab, f.selector_rank) for s in CODEBOOKS},
    }
    for i in range(layers):
        for side in ("attention_conv", "mlp_conv"):
            p = f"layers.{i}.{side}."
            shapes[p + "base_kernel"] = (2, f.conv_kernel_size, hidden)
            shapes[p + "kernel_projection.weight"] = (2 * f.conv_kernel_size * groups, hidden)
    return shapes


def causal_conv(x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """x [n, H]; dyn [n, K, groups] (per output position); base [K, H]: y as in the docstring."""
    n, h = x.shape
    k, groups = dyn.shape[1], dyn.shape[2]
    xs = x.view(n, groups, h // groups)
    out = torch.zeros_like(xs)
    for j in range(min(k, n)):  # a tap past the block's start reads only zeros
        shifted = torch.cat([xs.new_zeros(j, *xs.shape[1:]), xs[: n - j]]) if j else xs
        tap = base[j].view(groups, h // groups) + dyn[:, j, :, None]
        out = out + tap * shifted
    return out.view(n, h)


@dataclass
class Conv:
    """One sublayer's pair of convolutions (before and after) and the projection of their kernels."""

    base: torch.Tensor  # [2, K, H]
    projection: Linear  # H -> 2 * K * groups

    def before(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u convolved, and the dynamic kernels [n, K, groups] the sublayer's output takes."""
        k = self.base.shape[1]
        dyn = self.projection(u).view(u.shape[0], 2, k, -1).to(u.dtype)
        return causal_conv(u, dyn[:, 0], self.base[0].to(u.dtype)), dyn[:, 1]

    def after(self, y: torch.Tensor, dyn: torch.Tensor) -> torch.Tensor:
        return causal_conv(y, dyn.to(y.dtype), self.base[1].to(y.dtype))


@dataclass
class Selector:
    projection: Linear  # H -> rank
    pred: torch.Tensor  # [V, rank]
    succ: torch.Tensor  # [V, rank]
    top_k: int

    def walk(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int) -> list[int]:
        """The greedy path over each row's top_k candidates, from the anchor, left to right."""
        acc = logits.dtype
        unary, cands = logits.topk(min(self.top_k, logits.shape[-1]), dim=-1)
        proj = self.projection(hidden).to(acc)
        prev = torch.tensor(anchor, device=logits.device)
        path = []
        for i in range(logits.shape[0]):
            context = self.pred[prev].to(acc) * proj[i]
            scores = unary[i] + self.succ[cands[i]].to(acc) @ context
            prev = cands[i, scores.argmax()]
            path.append(prev)
        return torch.stack(path).tolist() if path else []


def load_conv(read, lin, prefix: str) -> Conv:
    return Conv(read(prefix + "base_kernel"), lin(prefix + "kernel_projection"))


def load_selector(ckpt, f: DFlash2Fields, read, lin) -> Selector:
    names = [codebook_name(s, ckpt) for s in CODEBOOKS]
    pred, succ = (read(n) for n in names)
    return Selector(lin("candidate_selector.hidden_projection"), pred, succ, f.selector_top_k)
