"""Drafting over HTTP: `draft: false`, Predicted Outputs and their usage counts, /metrics and
/memory, with the bundled demo model (its replies repeat their prompts, so drafts land)."""

import pytest
from server_harness import make_engine, metric, start_server

from tensorfold.demo import demo_checkpoint

LINE = "the quick brown fox jumps over the lazy dog"  # a line the demo model copies
ASK = {
    "model": "demo",
    "messages": [{"role": "user", "content": f"Copy this line: {LINE}"}],
    "max_tokens": 64,
    "temperature": 0,
    "return_token_ids": True,
    "chat_template_kwargs": {"enable_thinking": False},  # the reply is its content alone
}


@pytest.fixture(scope="module")
def server():
    engine = make_engine(demo_checkpoint("bf16"), draft="ngram", prompt_cache_bytes=1 << 24)
    live = start_server(engine, name="demo")
    yield live
    live.stop()


def _chat(server, **more):
    with server.client() as http:
        r = http.post("/v1/chat/completions", json={**ASK, **more})
    assert r.status_code == 200, r.text
    return r.json()


def test_drafted_reply_equals_draft_false(server):
    plain = _chat(server, draft=False)
    drafted = _chat(server)
    pick = lambda body: (body["choices"][0]["message"]["content"], body["choices"][0]["token_ids"])  # noqa: E731
    assert pick(drafted) == pick(plain)
    assert "completion_tokens_details" not in drafted["usage"]  # no prediction asked
    text = server.metrics()
    assert metric(text, "tensorfold_draft_accepted_tokens") > 0
    assert metric(text, "tensorfold_draft_acceptance_length_count") > 0
    with server.client() as http:
        assert http.get("/memory").json()["draft_state_bytes"] > 0


def test_prediction_counts(server):
    plain = _chat(server, draft=False)
    reply = plain["choices"][0]["message"]["content"]
    drafted = _chat(server, prediction={"type": "content", "content": reply})
    assert drafted["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    details = drafted["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > len(plain["choices"][0]["token_ids"]) // 2
    guess = reply.replace("9", "7").replace("dog", "cat")  # right, wrong, right, wrong
    wrong = _chat(server, prediction={"type": "content", "content": guess})
    assert wrong["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    assert wrong["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] > 0
    off = _chat(server, draft=False, prediction={"type": "content", "content": reply})
    assert off["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 0


def test_prediction_through_the_openai_client(server):
    out = server.openai().chat.completions.create(
        model="demo",
        messages=ASK["messages"],
        max_tokens=64,
        temperature=0,
        prediction={"type": "content", "content": LINE},
    )
    assert LINE in out.choices[0].message.content
    assert out.usage.completion_tokens_details.accepted_prediction_tokens > 0


@pytest.mark.parametrize(
    "bad",
    [{"type": "text", "content": "x"}, {"content": "x"}, "x", {"type": "content", "content": 3}],
)
def test_bad_prediction_is_a_400(server, bad):
    with server.client() as http:
        r = http.post("/v1/chat/completions", json={**ASK, "prediction": bad})
    assert r.status_code == 400
    assert r.json()["error"]["param"].startswith("prediction")


@pytest.mark.parametrize(
    "rules",
    [
        {"frequency_penalty": 0.7, "presence_penalty": 0.3, "logit_bias": {"220": -3}},
        {"repetition_penalty": 1.3, "temperature": 0.8, "seed": 11},
        {"response_format": {"type": "json_object"}},
    ],
)
def test_drafting_keeps_the_request_rules(server, rules):
    """A drafted token is kept only if the request's own rule (penalties, bias, grammar, seeded
    draw) picks it at that position: drafted = plain with every rule on."""
    plain = _chat(server, draft=False, **rules)
    drafted = _chat(server, **rules)
    assert drafted["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]


def test_bench_decode_reports_acceptance_length(server, capsys, tmp_path, monkeypatch):
    """`tensorfold bench decode` against a drafting server: each request's acceptance length
    is the server's committed tokens over verify passes across that request (/metrics)."""
    import json

    from tensorfold.cli import main
    from tensorfold.receipts import bench

    readings, read = [], bench.draft_totals
    monkeypatch.setattr(bench, "draft_totals", lambda e: readings.append(read(e)) or readings[-1])
    out = tmp_path / "decode.json"
    argv = ["bench", "decode", server.url, "demo", "--tokens", "48", "--reps", "1"]
    assert main([*argv, "--prompts", "code", "--output", str(out)]) == 0
    (record,) = json.loads(out.read_text())["records"]
    (before, after) = readings
    assert after[1] > before[1]  # the request had verify passes
    assert record["accept_len"] == (after[0] - before[0]) / (after[1] - before[1]) > 1.0
    assert "accept len" in capsys.readouterr().out
