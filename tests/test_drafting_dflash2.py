"""DFlash2 drafters (z-lab DFlash2DraftModel) made tiny here with the published config fields and
tensor names: drafted = plain bitwise, the block pass and the selector's walk against a plain-torch
reading of the published equations (float64, loops), refusals by name before any read."""

import json

import pytest
import torch
import torch.nn.functional as F
from drafting_util import DRAFT_MODES, dflash2_over, drafted_run, write_drafter
from engine_util import make_engine, sample_prompt
from safetensors.torch import load_file, save_file

from tensorfold.config import ModelConfig
from tensorfold.drafters.choice import check
from tensorfold.errors import DraftForAnotherTarget, NotStockDrafter
from tensorfold.models.checkpoint import Checkpoint
from tensorfold.models.dflash import read_config

F64 = torch.float64


def _loud_selector(path, factor=4.0):
    """The codebooks scaled up, so that the walk's pair term outweighs the logits' gaps."""
    file = path / "model.safetensors"
    tensors = load_file(file)
    for name in tensors:
        if "codebook" in name:
            tensors[name] = (tensors[name].float() * factor).to(tensors[name].dtype)
    save_file(tensors, file, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def drafter(hf_tiny_b, tmp_path_factory):
    target = ModelConfig.from_dir(hf_tiny_b)
    out = tmp_path_factory.mktemp("dflash2") / "d"
    return _loud_selector(write_drafter(out, target, **dflash2_over(output_multiplier=0.7)))


@pytest.mark.parametrize("mode", sorted(DRAFT_MODES))
@pytest.mark.parametrize("parallel", [1, 4])
def test_dflash2_drafted_equals_plain(hf_tiny_b, drafter, mode, parallel):
    want, _ = drafted_run(hf_tiny_b, DRAFT_MODES[mode], 1, None, first_seed=70)
    got, eng = drafted_run(hf_tiny_b, DRAFT_MODES[mode], parallel, str(drafter), first_seed=70)
    assert got == want
    assert eng.drafting.default.model.selector is not None  # served as DFlash2, not as v1
    assert eng.drafting.stats.proposed > 0


# --- an independent reading of the published equations -------------------------------------


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rotary(x, pos, theta):
    """Neox rotary over the whole head: pairs (i, i + d/2) turned by pos * theta^(-2i/d)."""
    half = x.shape[-1] // 2
    ang = pos[:, None].to(F64) * theta ** (-2 * torch.arange(half, dtype=F64) / x.shape[-1])
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def _conv(x, dyn, base, group):
    """y_t = sum_j (base[j] + dyn_t[j] per group) * x_{t-j}, one position and tap at a time."""
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(base.shape[0]):
            if t >= j:
                y[t] += (base[j] + dyn[t, j].repeat_interleave(group)) * x[t - j]
    return y


def _attend(q, k, v, qpos, kpos, causal, window):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    gap = qpos[:, None] - kpos[None, :]
    seen = (gap < window) & ((gap >= 0) if causal else (-gap < window))
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def _reference(drafter, target_dir, feats, ids, convs=True):
    """(logits [n-1, V], greedy walk) for block `ids` after len(feats) context positions."""
    cfg = json.loads((drafter / "config.json").read_text())
    dc, eps, theta = cfg["dflash_config"], cfg["rms_norm_eps"], cfg["rope_theta"]
    w = {k: t.to(F64) for k, t in load_file(drafter / "model.safetensors").items()}
    tgt = Checkpoint(target_dir)
    table = next(tgt.read(n) for n in tgt.infos if n.endswith("embed_tokens.weight")).to(F64)
    head = tgt.read("lm_head.weight").to(F64)
    nh, nkv, hd = (cfg[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    K, group, causal = dc["conv_kernel_size"], dc["conv_group_size"], cfg.get("is_causal")
    ctx, n = feats.shape[0], len(ids)
    cpos, bpos = torch.arange(ctx), torch.arange(ctx, ctx + n)
    c = _rms(feats.to(F64) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    h = table[torch.tensor(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        kind = cfg["layer_types"][i]
        lcausal = kind == "sliding_attention" if causal is None else causal
        window = cfg["sliding_window"] if kind == "sliding_attention" else 1 << 30

        def wrap(name, u, op):
            dyn = (u @ w[p + name + ".kernel_projection.weight"].T).view(n, 2, K, -1)
            base = w[p + name + ".base_kernel"]
            if not convs:
                return op(u)
            return _conv(op(_conv(u, dyn[:, 0], base[0], group)), dyn[:, 1], base[1], group)

        def attn(x):
            a = p + "self_attn."

            def heads(z, proj, norm, count, pos):
                z = (z @ w[a + proj].T).view(-1, count, hd)
                return _rotary(_rms(z, w[a + norm], eps), pos, theta)

            q = heads(x, "q_proj.weight", "q_norm.weight", nh, bpos)
            k = torch.cat(
                [
                    heads(m, "k_proj.weight", "k_norm.weight", nkv, pos)
                    for m, pos in ((c, cpos), (x, bpos))
                ]
            )
            v = torch.cat([(m @ w[a + "v_proj.weight"].T).view(-1, nkv, hd) for m in (c, x)])
            out = _attend(q, k, v, bpos, torch.cat([cpos, bpos]), lcausal, window)
            return out.reshape(n, -1) @ w[a + "o_proj.weight"].T

        def mlp(x):
            m = p + "mlp."
            gate, up = x @ w[m + "gate_proj.weight"].T, x @ w[m + "up_proj.weight"].T
            return (F.silu(gate) * up) @ w[m + "down_proj.weight"].T

        h = h + wrap("attention_conv", _rms(h, w[p + "input_layernorm.weight"], eps), attn)
        h = h + wrap("mlp_conv", _rms(h, w[p + "post_attention_layernorm.weight"], eps), mlp)
    out = _rms(h, w["norm.weight"], eps)[1:]
    logits = out @ head.T * dc.get("output_multiplier", cfg.get("output_multiplier", 1.0))
    return logits, _walk(w, out, logits, ids[0], dc["selector_top_k"])


def _walk(w, out, logits, anchor, top_k):
    proj = out @ w["candidate_selector.hidden_projection.weight"].T
    pred, succ = (
        w["candidate_selector.predecessor_codebook"],
        w["candidate_selector.successor_codebook"],
    )
    prev, path = anchor, []
    for i in range(logits.shape[0]):
        cands = logits[i].topk(top_k).indices
        scores = logits[i, cands] + succ[cands] @ (pred[prev] * proj[i])
        prev = int(cands[scores.argmax()])
        path.append(prev)
    return path


@pytest.mark.parametrize("is_causal", [False, None])
def test_block_and_walk_match_the_equations(hf_tiny_b, tmp_path, is_causal):
    target = ModelConfig.from_dir(hf_tiny_b)
    over = dflash2_over(is_causal=is_causal, output_multiplier=0.7, block_size=7)
    if is_causal is None:
        over.pop("is_causal")
    path = _loud_selector(write_drafter(tmp_path / "d", target, seed=3, **over))
    eng = make_engine(hf_tiny_b, parallel=1, draft=str(path))
    d = eng.drafting.default
    c = d.model.config
    ctx = 11  # > the window (8): the first context positions are out of sight
    feats = torch.randn(
        ctx, len(c.taps) * c.hidden_size, generator=torch.Generator().manual_seed(5)
    )
    rows = torch.arange(ctx)
    d.model.context(feats, torch.arange(ctx), rows, d.kv)
    ids = [42] + [c.mask_token_id] * (c.block_size - 1)
    with torch.inference_mode():
        logits = d.model.block(eng.model.embed, eng.model.lm_head, ids, ctx, rows, d.kv)
        drafts = d.model.draft(eng.model.embed, eng.model.lm_head, ids, ctx, rows, d.kv)
    want, walk = _reference(path, hf_tiny_b, feats, ids)
    torch.testing.assert_close(logits.to(F64), want, atol=2e-4, rtol=2e-4)
    assert drafts == walk
    # The pieces matter here: the walk leaves the argmax, the convolutions move the logits.
    assert walk != want.argmax(-1).tolist()
    plain, _ = _reference(path, hf_tiny_b, feats, ids, convs=False)
    assert (plain - want).abs().max() > 0.1


def test_codebooks_named_as_module_weights_read_the_same(hf_tiny_b, drafter, tmp_path):
    """z-lab's files name the codebooks bare; an export with `.weight` gives the same drafts."""
    import shutil

    renamed = tmp_path / "renamed"
    shutil.copytree(drafter, renamed)
    file = renamed / "model.safetensors"
    tensors = {
        name + (".weight" if "codebook" in name else ""): t for name, t in load_file(file).items()
    }
    save_file(tensors, file, metadata={"format": "pt"})
    drafts = []
    for path in (drafter, renamed):
        eng = make_engine(hf_tiny_b, parallel=1, draft=str(path))
        d = eng.drafting.default
        width = len(d.model.config.taps) * d.model.config.hidden_size
        feats = torch.randn(6, width, generator=torch.Generator().manual_seed(2))
        d.model.context(feats, torch.arange(6), torch.arange(6), d.kv)
        ids = [17] + [d.model.config.mask_token_id] * 5
        with torch.inference_mode():
            drafts.append(
                d.model.draft(eng.model.embed, eng.model.lm_head, ids, 6, torch.arange(6), d.kv)
            )
    assert drafts[0] == drafts[1] and len(drafts[0]) == 5


def test_short_block_reads_zeros_past_its_start(hf_tiny_b, tmp_path):
    """k = 1 (a block of 2) and a kernel of 3: the taps that reach before the anchor read 0."""
    target = ModelConfig.from_dir(hf_tiny_b)
    path = write_drafter(tmp_path / "d", target, **dflash2_over(conv_kernel_size=3))
    eng = make_engine(hf_tiny_b, parallel=1, draft=str(path))
    d = eng.drafting.default
    feats = torch.randn(4, 2 * target.hidden_size, generator=torch.Generator().manual_seed(1))
    d.model.context(feats, torch.arange(4), torch.arange(4), d.kv)
    ids = [9, d.model.config.mask_token_id]
    with torch.inference_mode():
        logits = d.model.block(eng.model.embed, eng.model.lm_head, ids, 4, torch.arange(4), d.kv)
    want, _ = _reference(path, hf_tiny_b, feats, ids)
    torch.testing.assert_close(logits.to(F64), want, atol=2e-4, rtol=2e-4)


# --- refusals by name, before any weight is read --------------------------------------------


def _without(*keys):
    def over(t):
        o = dflash2_over()
        for k in keys:
            o.pop(k)
        return o

    return over


MISBOUND = {
    "conv_kernel_alone": (
        NotStockDrafter,
        _without("conv_group_size"),
        "conv_kernel_size without conv_group_size",
    ),
    "conv_group_alone": (
        NotStockDrafter,
        _without("conv_kernel_size"),
        "conv_group_size without conv_kernel_size",
    ),
    "selector_rank_alone": (
        NotStockDrafter,
        _without("selector_top_k"),
        "selector_rank without selector_top_k",
    ),
    "selector_top_k_alone": (
        NotStockDrafter,
        _without("selector_rank"),
        "selector_top_k without selector_rank",
    ),
    "no_selector": (
        NotStockDrafter,
        _without("selector_rank", "selector_top_k"),
        "without selector_rank and selector_top_k",
    ),
    "group_not_dividing": (
        NotStockDrafter,
        lambda t: dflash2_over(conv_group_size=48),
        "does not divide hidden_size",
    ),
    "zero_kernel": (
        NotStockDrafter,
        lambda t: dflash2_over(conv_kernel_size=0),
        "positive integers",
    ),
    "top_k_past_vocab": (
        NotStockDrafter,
        lambda t: dflash2_over(selector_top_k=1 << 20),
        "selector_top_k .* > vocab_size",
    ),
    "dspark_marker": (NotStockDrafter, lambda t: dflash2_over(markov_rank=4), "markov_rank"),
    "v1_with_selector": (
        NotStockDrafter,
        lambda t: {"selector_rank": 8, "selector_top_k": 5},
        "stock DFlash v1 field",
    ),
    "width": (
        DraftForAnotherTarget,
        lambda t: dflash2_over(hidden_size=2 * t.hidden_size),
        "hidden_size",
    ),
    "vocab": (
        DraftForAnotherTarget,
        lambda t: dflash2_over(vocab_size=t.vocab_size + 16),
        "vocab_size",
    ),
    "depth": (
        DraftForAnotherTarget,
        lambda t: dflash2_over(num_target_layers=t.num_layers + 4),
        "num_target_layers",
    ),
    "taps": (
        DraftForAnotherTarget,
        lambda t: dflash2_over(target_layer_ids=[1, t.num_layers]),
        "target_layer_ids",
    ),
    "mask_id": (
        DraftForAnotherTarget,
        lambda t: dflash2_over(mask_token_id=t.vocab_size),
        "mask_token_id",
    ),
}


@pytest.mark.parametrize("case", sorted(MISBOUND))
def test_misbound_dflash2_refused_before_any_read(hf_tiny_b, tmp_path, case, monkeypatch):
    error, over, why = MISBOUND[case]
    target = ModelConfig.from_dir(hf_tiny_b)
    good = read_config(write_drafter(tmp_path / "good", target, **dflash2_over()))
    path = write_drafter(tmp_path / case, target, shapes_from=good, **over(target))
    reads = []
    monkeypatch.setattr(Checkpoint, "read", lambda self, name: reads.append(name))
    with pytest.raises(error, match=why):
        check(str(path), 4, hf_tiny_b)  # what serve and run call before loading
    assert reads == []


def test_codebooks_for_another_vocabulary_are_refused(hf_tiny_b, tmp_path, monkeypatch):
    target = ModelConfig.from_dir(hf_tiny_b)
    other = dflash2_over(vocab_size=target.vocab_size + 64)
    wide = read_config(write_drafter(tmp_path / "wide", target, **other))
    path = write_drafter(tmp_path / "d", target, shapes_from=wide, **dflash2_over())
    monkeypatch.setattr(Checkpoint, "read", lambda self, name: pytest.fail(f"read {name}"))
    with pytest.raises(DraftForAnotherTarget, match="codebook"):
        check(str(path), 4, hf_tiny_b)


def test_published_dflash2_config_reads(tmp_path):
    """z-lab's own DFlash2 config fields (a 52-layer target, hidden 6656) read as DFlash2."""
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED))
    c = read_config(tmp_path)
    assert (c.v2.conv_kernel_size, c.v2.conv_group_size) == (2, 16)
    assert (c.v2.selector_rank, c.v2.selector_top_k) == (256, 16)
    assert c.is_causal is False and c.sliding_window == 2048 and c.block_size == 16
    assert not any(c.causal(i) for i in range(5)) and c.window(0) == 2048
    assert (c.output_multiplier, c.softcap, c.taps) == (
        0.19611613513818404,
        20.0,
        (1, 13, 25, 37, 49),
    )


PUBLISHED = {
    "architectures": ["DFlash2DraftModel"],
    "attention_bias": False,
    "is_causal": False,
    "dflash_config": {
        "block_size": 16,
        "conv_group_size": 16,
        "conv_kernel_size": 2,
        "final_logit_softcapping": 20.0,
        "mask_token_id": 201818,
        "output_multiplier": 0.19611613513818404,
        "selector_rank": 256,
        "selector_top_k": 16,
        "target_layer_ids": [1, 13, 25, 37, 49],
    },
    "head_dim": 128,
    "hidden_size": 6656,
    "intermediate_size": 19968,
    "layer_types": ["sliding_attention"] * 5,
    "max_window_layers": 5,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "num_target_layers": 52,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
    "sliding_window": 2048,
    "use_sliding_window": True,
    "vocab_size": 202048,
}


def test_served_over_http_equals_draft_false(hf_tiny_b, drafter):
    """`--draft PATH` as serve builds it: a seeded reply is the reply with `"draft": false`."""
    from server_harness import make_engine as serving_engine
    from server_harness import metric, start_server

    live = start_server(serving_engine(hf_tiny_b, draft=str(drafter)))
    ask = {"model": "tiny", "prompt": sample_prompt(5, 24, 300), "max_tokens": 24}
    ask |= {"temperature": 0.9, "seed": 3, "ignore_eos": True, "return_token_ids": True}
    try:
        with live.client() as http:
            bodies = [
                http.post("/v1/completions", json=ask | more) for more in ({}, {"draft": False})
            ]
        assert [r.status_code for r in bodies] == [200, 200], bodies[0].text
        ids = [r.json()["choices"][0]["token_ids"] for r in bodies]
        assert ids[0] == ids[1] and len(ids[0]) == 24
        assert metric(live.metrics(), "tensorfold_draft_proposed_tokens") > 0
    finally:
        live.stop()


def test_llm_refuses_a_misbound_dflash2_before_loading(hf_tiny_b, tmp_path, monkeypatch):
    from tensorfold.llm import LLM

    target = ModelConfig.from_dir(hf_tiny_b)
    good = read_config(write_drafter(tmp_path / "good", target, **dflash2_over()))
    path = write_drafter(tmp_path / "d", target, shapes_from=good, **_without("conv_group_size")(0))
    monkeypatch.setattr(Checkpoint, "read", lambda self, name: pytest.fail(f"read {name}"))
    with pytest.raises(NotStockDrafter, match="conv_kernel_size without conv_group_size"):
        LLM(hf_tiny_b, draft=str(path))
