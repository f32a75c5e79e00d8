"""Train a Qwen3.5 MTP head (`mtp.*`) for the bundled demo model, so `--draft mtp` drafts with it.

The target is frozen. Replies are the target's own (greedy, through TensorFold's engine), so the
head learns what the target says. The head reads the target's hidden state after its final norm
at position i and the token at i+1, and is trained to predict the token at i+2 (docs/model.md,
'MTP head'), on reply positions. Drafting feeds the head's own output back for each further
draft, so training unrolls --depth such steps with the attention each step sees when drafting
(`chain_mask`), and the loss is the mean over the steps. It is saved under the published names, in bf16, as a file of
its own beside the model (`model-mtp.safetensors`: the loader reads every safetensors file of
a folder without an index), then drafted with and checked: drafted = plain on held-out prompts,
and the acceptance length.

    PYTHONPATH=src python scripts/train_mtp.py --checkpoint src/tensorfold/demo/bf16 --device cuda
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=Path("src/tensorfold/demo/bf16"))
    p.add_argument(
        "--out", type=Path, default=None, help="default: CHECKPOINT/model-mtp.safetensors"
    )
    p.add_argument("--examples", type=int, default=60_000, help="prompts whose replies train it")
    p.add_argument("--eval", type=int, default=256, help="held-out prompts for the check")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument(
        "--depth",
        type=int,
        default=3,
        help="draft steps unrolled in training (its own outputs fed back)",
    )
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lanes", type=int, default=64, help="engine lanes while generating replies")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def replies(checkpoint: Path, prompts: list[list[int]], lanes: int, device: str, draft=None):
    """The target's greedy replies (TensorFold's engine); with `draft`, also its drafting stats."""
    from tensorfold import LLM, SamplingParams

    llm = LLM(checkpoint, device=device, parallel=lanes, context=512, draft=draft)
    params = SamplingParams(max_tokens=160, temperature=0.0)
    out = [
        o.outputs[0].token_ids
        for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    ]
    return out, llm.engine.drafting.stats


class MTPHead(nn.Module):
    """The head as the released files name it; norms zero-centred (1 + w), as the trunk's."""

    def __init__(self, cfg) -> None:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as tf

        super().__init__()
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = tf.Qwen3_5RMSNorm(h, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = tf.Qwen3_5RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(
            [tf.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention"))]
        )
        self.norm = tf.Qwen3_5RMSNorm(h, cfg.rms_norm_eps)
        self.rotary = tf.Qwen3_5TextRotaryEmbedding(cfg)

    def inputs(self, embed_next: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's input rows: fc over [norm(embedding of the next token), norm(state)]."""
        return self.fc(
            torch.cat([self.pre_fc_norm_embedding(embed_next), self.pre_fc_norm_hidden(hidden)], -1)
        )

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The normed outputs of input rows x [B, L, H] at positions pos [B, L] under an additive
        mask [L, L]."""
        x = self.layers[0](
            x,
            position_embeddings=self.rotary(x, pos[None].expand(3, -1, -1)),  # mrope's 3 grids
            attention_mask=mask[None, None],
            position_ids=pos,
        )
        return self.norm(x)


def chain_mask(depth: int, rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [depth·rows], additive mask) of `depth` blocks of rows, as drafting sees them.

    Row (j, r) is chain r's j-th draft step, at position r + j - 1: step 1 reads the target's
    state, step j > 1 the head's own output of step j - 1. At drafting time the head's cache
    holds step-1 rows for positions <= r (the target's states) and this chain's own steps, so
    row (j, r) attends to (1, r') for r' <= r and to (j', r) for 2 <= j' <= j."""
    r = torch.arange(rows, device=device)
    j = torch.arange(1, depth + 1, device=device)
    rr, jj = r.repeat(depth), j.repeat_interleave(rows)
    first = (jj[None, :] == 1) & (rr[None, :] <= rr[:, None])
    own = (jj[None, :] > 1) & (rr[None, :] == rr[:, None]) & (jj[None, :] <= jj[:, None])
    mask = torch.full((depth * rows, depth * rows), torch.finfo(torch.float32).min, device=device)
    return rr + jj - 1, mask.masked_fill(first | own, 0.0)


def batches(seqs: list[list[int]], starts: list[int], batch: int, pad: int, g: torch.Generator):
    """Endless (ids [B, T], reply [B, T]): reply marks the positions of the target's replies."""
    while True:
        for idx in torch.randperm(len(seqs), generator=g).split(batch):
            width = max(len(seqs[i]) for i in idx)
            ids = torch.full((len(idx), width), pad)
            reply = torch.zeros(len(idx), width, dtype=torch.bool)
            for r, i in enumerate(idx):
                s = seqs[i]
                ids[r, : len(s)] = torch.tensor(s)
                reply[r, starts[i] : len(s)] = True
            yield ids, reply


def chain_loss(target, head, ids: torch.Tensor, reply: torch.Tensor, depth: int) -> torch.Tensor:
    """Mean over steps 1..depth of the cross-entropy of chain r's step j against t[r + j + 1]."""
    rows = ids.shape[1] - 2
    with torch.no_grad():
        hidden = target.model(input_ids=ids).last_hidden_state  # after the final norm
        e = target.get_input_embeddings()(ids)
    at = torch.arange(rows, device=ids.device)
    outs, xs, losses = [hidden[:, :rows]], [], []
    for j in range(1, depth + 1):
        nxt = (at + j).clamp_max(ids.shape[1] - 1)
        xs.append(head.inputs(e[:, nxt], outs[-1]))
        pos, mask = chain_mask(j, rows, ids.device)
        # steps 1..j again: step j attends to their keys, which the layer does not hand back
        out = head(torch.cat(xs, 1), pos[None].expand(ids.shape[0], -1), mask)[:, -rows:]
        outs.append(out)
        want = (at + j + 1).clamp_max(ids.shape[1] - 1)
        keep = reply[:, want] & (at + j + 1 < ids.shape[1])
        logits = target.lm_head(out[keep]).float()
        losses.append(nn.functional.cross_entropy(logits, ids[:, want][keep]))
    return torch.stack(losses).mean()


def train(args, target, head, seqs, starts, pad) -> list[float]:
    dev = args.device
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)
    losses, stream = [], batches(seqs, starts, args.batch, pad, g)
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        lr *= 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        ids, reply = (t.to(dev) for t in next(stream))
        loss = chain_loss(target, head, ids, reply, args.depth)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss:.4f} lr {lr:.2e}", flush=True)
    return losses


def save_head(head: MTPHead, out: Path) -> int:
    tensors = {}
    for name, t in head.state_dict().items():
        if name.startswith("rotary."):
            continue
        tensors["mtp." + name] = t.detach().to(torch.bfloat16).cpu().contiguous()
    save_file(tensors, out, metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def main() -> None:
    args = parse_args()
    from transformers import AutoConfig, Qwen3_5ForCausalLM

    from tensorfold.demo.data import generate
    from tensorfold.tokenizer import Tokenizer

    start = time.perf_counter()
    out = args.out or args.checkpoint / "model-mtp.safetensors"
    if out.exists():
        out.unlink()  # the target's own replies, without a head in the folder
    tok = Tokenizer(args.checkpoint)
    samples = generate(args.seed, args.examples + args.eval)
    prompts = [tok.encode(s.prompt_text()) for s in samples]
    train_prompts, eval_prompts = prompts[: args.examples], prompts[args.examples :]
    made, _ = replies(args.checkpoint, train_prompts, args.lanes, args.device)
    seqs = [p + r for p, r in zip(train_prompts, made)]
    starts = [len(p) for p in train_prompts]
    print(f"{len(seqs)} replies in {time.perf_counter() - start:.0f} s", flush=True)

    cfg = AutoConfig.from_pretrained(args.checkpoint)
    cfg._attn_implementation = "eager"
    target = Qwen3_5ForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).to(
        args.device
    )
    target.requires_grad_(False).eval()
    head = MTPHead(cfg).to(args.device)
    losses = train(args, target, head, seqs, starts, cfg.pad_token_id or 0)
    params = save_head(head, out)

    plain, _ = replies(args.checkpoint, eval_prompts, args.lanes, args.device)
    drafted, stats = replies(args.checkpoint, eval_prompts, args.lanes, args.device, "mtp")
    record = {
        "parameters": params,
        "file": str(out),
        "final_loss": sum(losses[-50:]) / len(losses[-50:]),
        "drafted_equals_plain": drafted == plain,
        "acceptance_length": stats.acceptance_length,
        "accepted_per_proposed": stats.accepted / max(1, stats.proposed),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {k: str(v) for k, v in vars(args).items()},
    }
    (out.parent / "mtp_train_log.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2), flush=True)


if __name__ == "__main__":
    main()
