"""Tensor split over torch.distributed (gloo, loopback): split = whole bitwise, refusals by name,
two torchrun "nodes", and a rank that dies under a live server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from server_harness import process_up
from split_util import free_port, split_results, whole_results

from tensorfold.cli import main
from tensorfold.config import ModelConfig
from tensorfold.errors import NonFiniteLogits, SplitRefused
from tensorfold.models.split import plan_shard, row_ranges, row_widths
from tensorfold.ops.collective import split_argmax

SRC = str(Path(__file__).resolve().parents[1] / "src")
PROMPT = [501, 84, 82, 298, 198, 406, 290, 220, 17, 285, 220, 18, 30, 502, 198, 501, 324]


@pytest.mark.parametrize(
    "fixture, world",
    [
        ("hf_tiny", 2),  # tied, GQA 2, GDN key heads 2 -> value heads 4
        ("hf_tiny_b", 2),  # untied, GQA 3, one GDN head per rank, sharded files
        ("hf_tiny", 4),  # one query head per rank: KV heads and GDN key heads replicated
        ("hf_uneven", 2),  # KV and GDN key heads 2/1 (query and value heads 4/2)
        # vocabulary 515 and MLP width 130 cut 129/129/129/128; KV and GDN key heads held by
        # 2/1/1 ranks (one replicated over two), their query and value heads 1+1/2/2
        ("hf_uneven", 4),
        ("mlx_mixed", 2),  # MLX per-module bits, packed rows split
        ("mlx_moe_q4", 2),  # MoE: experts split by expert (packed stacks), shared expert by rows
    ],
)
def test_split_equals_whole(fixture, world, request):
    """Token ids, logits bytes and fingerprints of the split equal the whole model's: prompts
    chunked at 128 and 37, one lane and four, greedy and seeded sampling, a prompt-cache resume."""
    path = request.getfixturevalue(fixture)
    whole, split = whole_results(path), split_results(path, world)
    assert split.keys() == whole.keys()
    for key in whole:
        assert split[key] == whole[key], key
    assert whole["resumed"][2] > 0, "the second request resumed from the prompt cache"
    assert whole["decode_128"] == whole["decode_37"]


@pytest.mark.parametrize("fixture, world", [("hf_tiny", 2), ("hf_tiny", 4), ("mlx_moe_q4", 2)])
def test_split_equals_whole_in_the_chunk_form(fixture, world, request):
    """The gated delta rule in 64-row grid chunks under a split: each rank keeps its heads'
    boundary states and tails, and the leader's form reaches the followers; token ids, logits
    bytes and fingerprints (tails included) equal the whole model's in the same form (four ranks:
    the GDN key heads replicated; the MoE model's experts split by expert)."""
    path = request.getfixturevalue(fixture)
    whole = whole_results(path, gdn_form="chunk")
    split = split_results(path, world, scenario="exactness-chunk-form")
    assert split.keys() == whole.keys()
    for key in whole:
        assert split[key] == whole[key], key
    assert whole["decode_128"] == whole["decode_37"]
    recurrence = whole_results(path)  # the other form rounds differently: the chunks ran
    assert whole["prompt_logits_128"] != recurrence["prompt_logits_128"]


def test_refusals_name_the_split(hf_tiny, hf_tiny_b, hf_moe):
    cfg = ModelConfig.from_dir(hf_tiny_b)  # one GDN value head per key head: not 2 ranks each
    with pytest.raises(SplitRefused, match="linear_num_value_heads \\(2\\) cannot give each rank"):
        plan_shard(cfg, 0, 4, torch.float32)
    with pytest.raises(SplitRefused, match="float64"):
        plan_shard(ModelConfig.from_dir(hf_tiny), 0, 2, torch.float64)
    with pytest.raises(SplitRefused, match="num_experts \\(16\\) is not divisible by 3"):
        plan_shard(ModelConfig.from_dir(hf_moe), 0, 3, torch.float32)
    with pytest.raises(SplitRefused, match="num_attention_heads \\(4\\) cannot give each rank"):
        plan_shard(ModelConfig.from_dir(hf_tiny), 0, 5, torch.float32)


@pytest.mark.parametrize("world", [2, 3, 5, 6, 8, 16])
def test_the_9b_heads_split_over_any_rank_count(world):
    """Every head on some rank, in order; a replicated key head counted once; each rank's query
    (value) heads an equal share of its KV (GDN key) heads, as in the whole model."""
    from tensorfold.models.split import plan_split
    from tensorfold.tools.shapes import text_config

    cfg = ModelConfig.from_dict(dict(text_config("9b"), model_type="qwen3_5_text"))
    plans = plan_split(cfg, world, torch.bfloat16)
    for groups, members, total in (
        ("kv_heads", "q_heads", cfg.num_heads),
        ("k_heads", "v_heads", cfg.linear_num_value_heads),
    ):
        held = [getattr(s, members) for s in plans]
        assert [h.first for h in held] == [0, *[h.first + h.count for h in held[:-1]]]
        assert sum(h.count for h in held) == total
        owned = [getattr(s, groups) for s in plans if getattr(s, groups).owner]
        assert [g.first for g in owned] == [0, *[g.first + g.count for g in owned[:-1]]]
        per = total // sum(g.count for g in owned)
        for s in plans:
            g, m = getattr(s, groups), getattr(s, members)
            assert g.first <= m.first // per and (m.first + m.count - 1) // per < g.first + g.count
            assert m.count % g.count == 0 and (g.count == 1 or m.count == g.count * per)


def test_cli_refuses_before_any_rank_starts(hf_tiny_b, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = ["run", str(hf_tiny_b), "--device", "cpu", "--tokens", "[1, 2]", "--tensor-parallel"]
    assert main(args + ["4"]) == 2
    assert (
        "SplitRefused: --tensor-parallel 4: linear_num_value_heads (2)" in capsys.readouterr().err
    )


def test_split_argmax_is_the_whole_argmax():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 64, generator=g)
    rows[1, 5] = rows[1, 40] = 9.0  # a tie across ranks: the lower id
    rows[2, 3] = rows[2, 4] = 9.0  # a tie inside a rank
    rows[3, 50] = rows[3, 10] = 9.0
    for widths in ((64,), (32, 32), (16,) * 4, (22, 21, 21), (5, 40, 19), row_widths(64, 6)):
        assert split_argmax(rows, widths) == rows.argmax(-1).tolist(), widths
    assert split_argmax(rows, (32, 32))[1:4] == [5, 3, 10]
    assert split_argmax(rows, (5, 40, 19))[1:4] == [5, 3, 10]  # ties across uneven slices
    rows[4, 7] = float("nan")
    with pytest.raises(NonFiniteLogits, match="row 4"):
        split_argmax(rows, (32, 32))
    rows[4, 7] = float("inf")
    with pytest.raises(NonFiniteLogits):
        split_argmax(rows, (21, 43))


def test_uneven_row_cuts_cover_the_rows_in_order():
    assert row_ranges(395, 2) == ((0, 198), (198, 395))
    assert row_widths(248320, 3) == (82774, 82773, 82773)
    for total, world in ((395, 2), (248320, 6), (130, 4), (7, 7)):
        cuts = row_ranges(total, world)
        assert cuts[0][0] == 0 and cuts[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
        assert max(row_widths(total, world)) - min(row_widths(total, world)) <= 1


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "PYTHONPATH": SRC + os.pathsep + env.get("PYTHONPATH", "")}


def _run_json(args: list[str], env: dict) -> dict:
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_torchrun_nodes_give_the_whole_tokens(hf_tiny_b, tmp_path):
    """Two torchrun "nodes" on loopback (one rank each, env:// rendezvous) against the whole."""
    run = ["-m", "tensorfold.cli", "run", str(hf_tiny_b), "--device", "cpu", "--json"]
    run += ["--tokens", json.dumps(PROMPT * 3), "--max-tokens", "6", "--ignore-eos"]
    run += ["--compare-chunk", "7", "--seams", "16"]  # fingerprints at seams, prompt end, reply end
    whole = _run_json([sys.executable, *run], _env())
    port = free_port()
    # each node writes to files: a pipe nobody reads while the other node is waited on can fill
    # and stall its writer (and with it the pair)
    logs = [(tmp_path / f"node{r}.out", tmp_path / f"node{r}.err") for r in (0, 1)]
    files = [(open(o, "w"), open(e, "w")) for o, e in logs]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node"]
            + ["1", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port"]
            + [str(port), *run[0:], "--tensor-parallel", "2"],
            env=_env(),
            stdout=files[rank][0],
            stderr=files[rank][1],
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        for node in nodes:
            node.wait(timeout=240)
    finally:
        for node in nodes:
            node.kill()
        for out, err in files:
            out.close()
            err.close()
    outs = [(o.read_text(), e.read_text()) for o, e in logs]
    assert [n.returncode for n in nodes] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    split = json.loads(outs[0][0].strip().splitlines()[-1])
    assert split["token_ids"] == whole["token_ids"] and len(whole["token_ids"]) == 6
    assert split["seams"] == whole["seams"] and len(whole["seams"]) == 5
    assert split["seams_equal"] and whole["seams_equal"]
    assert outs[1][0].strip() == ""  # rank 1 follows; only rank 0 prints


def _children(pid: int) -> list[int]:
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(k) for k in kids]


def test_served_split_and_a_lost_rank(hf_tiny):
    """`serve --tensor-parallel 2` answers like the whole model, reports each rank's memory and
    the collective time; once rank 1 dies, new work gets 503 at once (no hang)."""
    port = free_port()
    args = [sys.executable, "-m", "tensorfold.cli", "serve", str(hf_tiny), "--device", "cpu"]
    args += ["--port", str(port), "--context", "256", "--prompt-cache-gib", "0.01"]
    url, body = f"http://127.0.0.1:{port}", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    server = subprocess.Popen(args + ["--tensor-parallel", "2"], env=_env())
    try:
        process_up(url, server)
        split = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        memory = httpx.get(f"{url}/memory", timeout=30).json()
        assert [r["rank"] for r in memory["ranks"]] == [0, 1]
        assert memory["ranks"][1]["weights_bytes"] > 0
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert "tensorfold_collective_seconds" in metrics
        assert "tensorfold_collective_calls 0.0" not in metrics
        (follower,) = _children(server.pid)
        start, long = time.monotonic(), {**body, "max_tokens": 200, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=long, timeout=60) as stream:
            events = stream.iter_lines()
            assert next(e for e in events if e.startswith("data:"))  # the request is running
            os.kill(follower, signal.SIGKILL)  # mid-request
            rest = [e for e in events if e.startswith("data:")]
        # the stream ends, with the pass's error when the kill came before its last token
        assert rest[-1] == "data: [DONE]" and (len(rest) > 150 or "RankLost" in rest[-2])
        code = httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code
        assert code == 503 and time.monotonic() - start < 30
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503 and "RankLost" in health.json()["fault"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    whole_server = subprocess.Popen(args, env=_env())
    try:
        process_up(url, whole_server)
        whole = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    finally:
        whole_server.terminate()
        whole_server.wait(timeout=30)
    assert split["choices"][0]["text"] == whole["choices"][0]["text"]


def test_llm_tensor_parallel_gives_the_whole_tokens(hf_tiny_c):
    """LLM(..., tensor_parallel=2) in a process of its own (it becomes rank 0 of a split)."""
    code = (
        "import sys, json; from tensorfold.llm import LLM; "
        "from tensorfold.engine.request import SamplingParams as S; "
        "p = S(max_tokens=6, temperature=0.0, ignore_eos=True); "
        "out = [LLM(sys.argv[1], device='cpu', tensor_parallel=tp).generate([sys.argv[2:]], p)"
        "[0].outputs[0].token_ids for tp in (1, 2)]; print(json.dumps(out))"
    )
    args = [sys.executable, "-c", code, str(hf_tiny_c), *map(str, PROMPT)]
    whole, split = _run_json(args, _env())
    assert split == whole and len(whole) == 6


def test_a_rank_holds_only_its_rows(hf_tiny_b, mlx_mixed, hf_moe):
    """Rank 1 of 2 (loading needs no collective): its weights are its rows of the whole ones,
    its caches' widths its heads'."""
    from tensorfold.models.loader import load_model
    from tensorfold.ops.collective import Group

    for path in (hf_tiny_b, mlx_mixed):
        whole = load_model(path)
        part = load_model(path, group=Group(1, 2))
        assert part.weight_bytes < 0.75 * whole.weight_bytes
        cfg = whole.config
        w_attn, p_attn = whole.layers[3].mixer, part.layers[3].mixer
        w_gdn, p_gdn = whole.layers[0].mixer, part.layers[0].mixer
        rows = lambda lin, a, b: _dense(lin)[a:b]  # noqa: E731
        h = cfg.hidden_size
        assert torch.equal(_dense(p_attn.o_proj), rows(w_attn.o_proj, h // 2, h))
        q = 2 * cfg.head_dim * cfg.num_heads
        assert torch.equal(_dense(p_attn.q_proj), rows(w_attn.q_proj, q // 2, q))
        dv, hv = cfg.linear_value_head_dim, cfg.linear_num_value_heads
        assert torch.equal(_dense(p_gdn.in_proj_z), rows(w_gdn.in_proj_z, dv * hv // 2, dv * hv))
        assert torch.equal(p_gdn.A_log, w_gdn.A_log[hv // 2 :])
        v = _dense(w_gdn.in_proj_qkv)[2 * cfg.key_dim + dv * hv // 2 :]
        assert torch.equal(_dense(p_gdn.in_proj_qkv)[-dv * hv // 2 :], v)
        assert part.cache_widths.v_heads == hv // 2 and part.cache_widths.kv_heads == 1
    whole, part = load_model(hf_moe), load_model(hf_moe, group=Group(1, 2))  # experts one by one
    e = whole.config.moe.num_experts
    w_exp, p_exp = whole.layers[0].mlp.experts, part.layers[0].mlp.experts
    assert p_exp.num_experts == e // 2 and part.layers[0].mlp.first == e // 2
    assert torch.equal(p_exp.down.weight, w_exp.down.weight[e // 2 :])


def _dense(lin) -> torch.Tensor:
    w = lin.weight
    return w if isinstance(w, torch.Tensor) else w.rows(0, w.shape[0], torch.float32)


def test_a_launcher_with_other_ranks_is_refused(monkeypatch):
    from tensorfold.runner.distributed import init_group

    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SplitRefused, match="--tensor-parallel 2, but the launcher started 3"):
        init_group(2, torch.device("cpu"))


def test_drafting_with_a_split_is_refused_by_name(hf_tiny):
    """The other ranks do not keep the lanes' spare state slots: --draft with a split is refused
    before any weight is read."""
    from tensorfold.drafters.choice import check
    from tensorfold.errors import SplitRefused

    with pytest.raises(SplitRefused, match="tensor split"):
        check("ngram", 4, hf_tiny, ranks=2)
    assert check("ngram", 4, hf_tiny, ranks=1).method == "ngram"
