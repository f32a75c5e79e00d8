"""The `mtp` drafter: Qwen3.5's MTP head, made tiny here with its published tensor names and
shapes. Drafted = plain bitwise whatever the head guesses; a head that does not fit its target
is refused by name before any weight is read."""

import shutil

import pytest
import torch
from drafting_util import assert_overlapped_reads_as_sequential, drafted_run
from engine_util import make_engine
from fixtures.checkpoints import _add_tensors

from tensorfold.config import ModelConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.errors import DraftForAnotherTarget, NotStockDrafter
from tensorfold.models.checkpoint import Checkpoint
from tensorfold.models.mtp import mtp_shapes

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=20, temperature=0.8, top_k=40, seed=5, ignore_eos=True)


def with_head(src, out, shapes=None, drop=(), seed=0):
    """A copy of checkpoint `src` with a random MTP head (`shapes` overrides published ones)."""
    shutil.copytree(src, out)
    shapes = {**mtp_shapes(ModelConfig.from_dir(src)), **(shapes or {})}
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "mtp." + name: (torch.randn(shape, generator=g) * 0.2).to(torch.bfloat16)
        for name, shape in shapes.items()
        if name not in drop
    }
    _add_tensors(out, tensors)
    return out


def _plain_reply(path, prompt: list[int], params: SamplingParams):
    """The plain engine's request for `prompt` (one lane), run to its end."""
    plain = make_engine(path, parallel=1)
    want = plain.add_request(prompt, params)
    plain.run_until_done()
    return want


@pytest.fixture(scope="module")
def hf_mtp(hf_tiny_b, tmp_path_factory):
    return with_head(hf_tiny_b, tmp_path_factory.mktemp("mtp") / "hf_mtp")


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("parallel", [1, 4])
def test_mtp_drafted_equals_plain(hf_mtp, params, parallel):
    want, _ = drafted_run(hf_mtp, params, 1, None, first_seed=40, lengths=(12, 33, 7, 50))
    got, eng = drafted_run(hf_mtp, params, parallel, "mtp", first_seed=40, lengths=(12, 33, 7, 50))
    assert got == want
    assert eng.drafting.stats.proposed > 0  # the head drafted
    assert eng.memory().draft_state_bytes >= eng.drafting.default.kv.nbytes > 0


def test_head_without_mtp_tensors_is_refused(hf_tiny_b, hf_tiny_nested):
    for path in (hf_tiny_b, hf_tiny_nested):  # none at all; only a few (no attention)
        with pytest.raises(NotStockDrafter):
            make_engine(path, draft="mtp")


WRONG = {  # the target's width doubled in fc; a head with twice the KV heads
    "fc_width": lambda c: {"fc.weight": (c.hidden_size, 4 * c.hidden_size)},
    "kv_heads": lambda c: {
        "layers.0.self_attn.k_proj.weight": (2 * c.num_kv_heads * c.head_dim, c.hidden_size)
    },
}


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_head_for_another_target_is_refused_before_reads(hf_tiny_b, tmp_path, wrong, monkeypatch):
    from tensorfold.models.mtp import check_mtp
    from tensorfold.models.weights import WeightMap

    cfg = ModelConfig.from_dir(hf_tiny_b)
    path = with_head(hf_tiny_b, tmp_path / "other", WRONG[wrong](cfg))
    reads = []
    monkeypatch.setattr(Checkpoint, "read", lambda self, name: reads.append(name))
    with pytest.raises(DraftForAnotherTarget):
        check_mtp(WeightMap(Checkpoint(path), cfg), cfg)
    assert reads == []


def test_missing_head_tensor_is_refused(hf_tiny_b, tmp_path):
    path = with_head(hf_tiny_b, tmp_path / "partial", drop=("norm.weight",))
    with pytest.raises(NotStockDrafter, match="mtp.norm.weight"):
        make_engine(path, draft="mtp")


def test_head_matches_transformers_layers(hf_mtp):
    """The head's equations against transformers' own Qwen3.5 decoder layer and zero-centred
    norms, loaded with the head's weights (float32, causal, positions 0..n-1)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5 as tf

    from tensorfold.models.loader import load_model

    eng = make_engine(hf_mtp, parallel=1, draft="mtp")
    target, head = eng.model, eng.drafting.default
    n, h = 9, target.config.hidden_size
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, target.config.vocab_size, (n,), generator=g).tolist()
    hidden = torch.randn(n, h, generator=g)
    logits, out = head.run(torch.arange(n), 0, tokens, hidden)

    cfg = AutoConfig.from_pretrained(hf_mtp)
    cfg._attn_implementation = "eager"
    sd = {}
    for f in sorted(hf_mtp.glob("*.safetensors")):
        sd.update({k: v.float() for k, v in load_file(f).items() if k.startswith("mtp.")})
    norm = lambda name, x: (  # noqa: E731
        tf.Qwen3_5RMSNorm(h, cfg.rms_norm_eps).requires_grad_(False).eval()
    )
    layer = tf.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval()
    layer.load_state_dict(
        {k.removeprefix("mtp.layers.0."): v for k, v in sd.items() if ".layers.0." in k}
    )

    def rms(name, x):
        m = norm(name, x)
        m.weight.copy_(sd[f"mtp.{name}.weight"])
        return m(x)

    with torch.no_grad():
        e = load_model(hf_mtp).embed(torch.tensor(tokens)).float()
        x = torch.cat([rms("pre_fc_norm_embedding", e), rms("pre_fc_norm_hidden", hidden)], -1)
        x = (x @ sd["mtp.fc.weight"].T)[None]
        pos = torch.arange(n)[None]
        pe = tf.Qwen3_5TextRotaryEmbedding(cfg)(x, pos)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        y = rms("norm", layer(x, position_embeddings=pe, attention_mask=mask, position_ids=pos)[0])
        want = target.lm_head(y[-1:].float())[0]
    torch.testing.assert_close(out.float(), y, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(logits.float(), want, atol=2e-4, rtol=2e-4)


def test_run_refuses_a_missing_head_before_loading(hf_tiny_b, capsys, monkeypatch):
    from tensorfold.cli import main

    reads = []
    monkeypatch.setattr(Checkpoint, "read", lambda self, name: reads.append(name))
    argv = ["run", str(hf_tiny_b), "--tokens", "[1, 2, 3]", "--draft", "mtp"]
    assert main(argv) == 2
    assert "NotStockDrafter" in capsys.readouterr().err and reads == []


def test_run_drafts_with_the_head(hf_mtp, capsys):
    import json

    from tensorfold.cli import main

    argv = ["run", str(hf_mtp), "--tokens", "[5, 9, 11, 40]", "--max-tokens", "12", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--draft", "mtp", "--draft-tokens", "3"]) == 0
    drafted = json.loads(capsys.readouterr().out)
    assert drafted["token_ids"] == plain["token_ids"]
    assert drafted["draft"]["proposed"] > 0 and "draft" not in plain


def test_llm_refuses_a_missing_head_before_loading(hf_tiny_b, monkeypatch):
    from tensorfold import LLM

    reads = []
    monkeypatch.setattr(Checkpoint, "read", lambda self, name: reads.append(name))
    with pytest.raises(NotStockDrafter):
        LLM(hf_tiny_b, device="cpu", draft="mtp")
    assert reads == []


def test_draft_auto_drafts_with_a_head_and_runs_plain_without(hf_mtp, hf_tiny_b, capsys):
    """`--draft auto` (what `make serve` passes for the demo): the head when there is one, else
    plain decoding, saying which; the reply is the plain one either way."""
    import json

    from tensorfold.cli import main

    argv = ["run", "--tokens", "[5, 9, 11, 40]", "--max-tokens", "12", "--json"]
    for path, drafts in ((hf_mtp, True), (hf_tiny_b, False)):
        assert main([argv[0], str(path), *argv[1:]]) == 0
        plain = json.loads(capsys.readouterr().out)
        assert main([argv[0], str(path), *argv[1:], "--draft", "auto"]) == 0
        out = capsys.readouterr()
        drafted = json.loads(out.out)
        assert drafted["token_ids"] == plain["token_ids"]
        assert ("draft" in drafted) == drafts
        said = "drafting with the MTP head" if drafts else "serving without drafting"
        assert said in out.err


def test_draft_auto_refuses_a_head_for_another_target(hf_tiny_b, tmp_path):
    from tensorfold.drafters.choice import resolve_auto

    cfg = ModelConfig.from_dir(hf_tiny_b)
    path = with_head(hf_tiny_b, tmp_path / "other", WRONG["fc_width"](cfg))
    with pytest.raises(DraftForAnotherTarget):
        resolve_auto("auto", path)
    assert resolve_auto("auto", path, ranks=2)[0] is None  # no drafting with a split at all
    assert resolve_auto("ngram", path) == ("ngram", "")


def test_draft_auto_does_not_draft_on_a_gpu_without_graphs(hf_mtp):
    from tensorfold.drafters.choice import resolve_auto

    assert resolve_auto("auto", hf_mtp, device="cpu")[0] == "mtp"
    assert resolve_auto("auto", hf_mtp, device="cpu", graphs=False)[0] == "mtp"
    assert resolve_auto("auto", hf_mtp, device="cuda")[0] == "mtp"  # the head's steps as graphs
    method, note = resolve_auto("auto", hf_mtp, device="cuda", graphs=False)
    assert method is None and "--draft mtp" in note


@pytest.mark.parametrize("head", [True, False], ids=["head", "no-head"])
def test_serve_draft_auto_says_which(hf_mtp, hf_tiny_b, head):
    """`serve --draft auto` (what `make serve` passes for the demo) logs whether it drafts,
    before loading a weight."""
    import subprocess
    import sys

    code = "import sys; from tensorfold.cli import main; sys.exit(main(sys.argv[1:]))"
    path = hf_mtp if head else hf_tiny_b
    cmd = [sys.executable, "-c", code, "serve", str(path), "--port", "0", "--draft", "auto"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        said = ""
        for line in proc.stderr:
            if "--draft auto" in line or "loading" in line:
                said = line
                break
    finally:
        proc.kill()
        proc.wait(30)
    want = "drafting with the MTP head" if head else "serving without drafting"
    assert want in said


def test_head_through_the_layers_kernels_matches_the_plain_head(hf_mtp):
    """MTPHead.forward_pass (the layers' own ops over a pass's batch: what the GPU records as
    CUDA graphs) against the plain-torch head, over the same rows after a first call (its KV
    rows attended to): the same logits and outputs to float32 rounding."""
    from tensorfold.batch import ForwardBatch, Segment
    from tensorfold.ops.dispatch import lane_index

    eng = make_engine(hf_mtp, parallel=1, draft="mtp")
    target, drafter = eng.model, eng.drafting.default
    n, h = 11, target.config.hidden_size
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, target.config.vocab_size, (n,), generator=g)
    hidden = torch.randn(n, h, generator=g)
    rows = torch.arange(100, 100 + n)
    drafter.run(rows, 0, tokens[:6].tolist(), hidden[:6])  # the KV rows of positions 0..5
    want_logits, want = drafter.run(rows, 6, tokens[6:].tolist(), hidden[6:])

    seg = Segment(0, 6, 0, n - 6, rows)
    batch = ForwardBatch(
        tokens[6:], torch.arange(6, n), rows[6:], (seg,), torch.tensor([n - 7]),
        lane_index((seg,), "cpu", target.config.conv_kernel),
    )  # fmt: skip
    kv = (drafter.kv.k[0], drafter.kv.v[0])
    with torch.inference_mode():
        logits, out = drafter.head.forward_pass(target, tokens[6:], hidden[6:], batch, kv)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-4)
    assert int(logits.argmax()) == int(want_logits.argmax())


def test_a_resting_lane_reads_no_states_and_stays_exact(hf_mtp, monkeypatch):
    """A random head is always wrong: once its gate closes for long, the lane's head reads the
    target's states only in the last passes before each retry (no copy, no head rows between),
    and the reply is plain's."""
    from tensorfold.drafters.mtp import MTPLane
    from tensorfold.engine.drafting import Drafting

    prompt = list(range(5, 17))
    params = SamplingParams(max_tokens=160, temperature=0.0, ignore_eos=True)
    want = _plain_reply(hf_mtp, prompt, params)
    calls = {"pass": 0, "read": 0}

    def counted(key, real):
        def observe(*args):
            calls[key] += 1
            return real(*args)

        return observe

    monkeypatch.setattr(Drafting, "observe", counted("pass", Drafting.observe))
    monkeypatch.setattr(MTPLane, "observe", counted("read", MTPLane.observe))
    eng = make_engine(hf_mtp, parallel=1, draft="mtp", draft_tokens=4)
    req = eng.add_request(prompt, params)
    eng.run_until_done()
    assert req.output_ids == want.output_ids
    assert eng.drafting.stats.accepted <= eng.drafting.stats.proposed // 4  # mostly wrong
    assert calls["pass"] > 100 and calls["read"] < calls["pass"] // 2  # rests skipped most


def test_an_overlapped_head_reads_the_passes_before_a_retry_as_a_sequential_one(
    hf_mtp, monkeypatch
):
    """With overlap, a closed gate's head reads the target's states of the overlapped passes
    before its retry (after their tokens are chosen on the device), so it drafts exactly what
    the sequential drafting engine's head drafts, the replies are plain's, and the passes in
    which a gate counts down to its retry still overlap."""
    from tensorfold.drafters.mtp import MTPLane

    assert_overlapped_reads_as_sequential(hf_mtp, "mtp", MTPLane, monkeypatch)


def test_an_overlapped_prompt_longer_than_a_lanes_hold_stays_exact(hf_mtp):
    """A prompt of more rows than a lane holds before its head runs them, read in an overlapped
    pass whose first token is still on the device: the head runs the rows whose next token is
    read back and holds the last one, and the reply is plain's."""
    from tensorfold.drafters.mtp import MTPLane

    prompt = [5 + (7 * i) % 90 for i in range(MTPLane.MOST_PENDING + 6)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    want = _plain_reply(hf_mtp, prompt, params)
    eng = make_engine(hf_mtp, parallel=1, draft="mtp", draft_tokens=4, overlap=True)
    req = eng.add_request(prompt, params)
    eng.run_until_done()
    assert req.output_ids == want.output_ids
    assert eng.drafting.stats.proposed > 0  # the head drafted after the held prompt


def test_an_overlapped_engine_prices_no_pass_while_every_head_rests(hf_mtp, monkeypatch):
    """While every lane's gate rests (far from its retry), no lane will read a price soon: the
    overlapped steps record none (the host work a step saves), and the reply is plain's."""
    from tensorfold.drafters.gate import PassPrices

    prompt = list(range(5, 17))
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want = _plain_reply(hf_mtp, prompt, params)
    eng = make_engine(hf_mtp, parallel=1, draft="mtp", draft_tokens=4, overlap=True)
    req = eng.add_request(prompt, params)
    eng.step()  # admitted, its prompt read
    req.lane.draft.gate.skip = 10_000  # rests for the whole reply
    records, record = [], PassPrices.record
    monkeypatch.setattr(
        PassPrices, "record", lambda self, *a: records.append(a) or record(self, *a)
    )
    eng.run_until_done()
    assert req.output_ids == want.output_ids
    assert eng.drafting.stats.proposed == 0 and records == []


def test_held_rows_are_the_held_pieces_cut_at_the_last_read_token():
    """A lane's held states come back as its pieces in order, cut where the read tokens end (an
    overlapped pass's last row waits for its token): the rows a concatenation would give."""
    from tensorfold.drafters.mtp import MTPLane

    lane = MTPLane.__new__(MTPLane)
    lane.pending = [torch.randn(n, 4) for n in (3, 2, 4)]
    lane.done, lane.upto = 10, 19
    tokens = list(range(19))  # position 18's next token still on the device: 8 rows read
    ids, pieces = lane.held(tokens)
    assert ids == tokens[11:19] and [p.shape[0] for p in pieces] == [3, 2, 3]
    assert torch.equal(torch.cat(pieces), torch.cat(lane.pending)[:8])
    ids, pieces = lane.held(tokens + [19])
    assert len(ids) == 9 and torch.equal(torch.cat(pieces), torch.cat(lane.pending))
    lane.done = 19
    assert lane.held(tokens + [19]) is None
