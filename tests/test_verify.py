"""system_fingerprint on every response, and `tensorfold verify` replaying a saved exchange."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from server_harness import make_engine, start_server

from tensorfold.cli import main
from tensorfold.demo import demo_checkpoint
from tensorfold.engine.fingerprint import checkpoint_digest, system_fingerprint
from tensorfold.server.serving import SamplingDefaults

DEMO = demo_checkpoint()
CHAT = {
    "model": "tensorfold-demo",
    "messages": [{"role": "user", "content": "Reverse the word planet."}],
    "max_tokens": 48,
    "temperature": 0.7,
    "seed": 3,
    "n": 2,
    "return_token_ids": True,
}


@pytest.fixture(scope="module")
def demo():
    fp = system_fingerprint(DEMO, torch.float32, "cpu")
    defaults = SamplingDefaults.from_checkpoint(DEMO)  # as `tensorfold serve`: greedy by default
    server = start_server(
        make_engine(DEMO, context=1024), name="tensorfold-demo", fingerprint=fp, defaults=defaults
    )
    yield server
    server.stop()


def test_fingerprint_is_stable_and_names_what_fixes_the_bytes(hf_tiny, hf_tiny_b):
    fp = system_fingerprint(DEMO, torch.float32, "cpu")
    assert fp.startswith("fp_") and len(fp) == 19
    code = (
        "import torch; from tensorfold.engine.fingerprint import system_fingerprint as f; "
        f"print(f({str(DEMO)!r}, torch.float32, 'cpu'))"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == fp  # another process (a restart) computes the same
    assert system_fingerprint(DEMO, torch.bfloat16, "cpu") != fp
    assert system_fingerprint(DEMO, torch.float64, "cpu") != fp
    assert checkpoint_digest(hf_tiny) != checkpoint_digest(hf_tiny_b)


def test_every_response_carries_it(demo):
    client, fp = demo.openai(), system_fingerprint(DEMO, torch.float32, "cpu")
    kw = dict(model="tensorfold-demo", max_tokens=4)
    assert client.completions.create(prompt="What", **kw).system_fingerprint == fp
    msgs = CHAT["messages"]
    assert client.chat.completions.create(messages=msgs, **kw).system_fingerprint == fp
    for stream in (
        client.completions.create(prompt="What", stream=True, **kw),
        client.chat.completions.create(
            messages=msgs, stream=True, stream_options={"include_usage": True}, **kw
        ),
    ):
        assert {chunk.system_fingerprint for chunk in stream} == {fp}


def _saved(demo, tmp_path, body):
    with demo.client() as http:
        response = http.post("/v1/chat/completions", json=body).json()
    req, resp = tmp_path / "request.json", tmp_path / "response.json"
    req.write_text(json.dumps(body))
    resp.write_text(json.dumps(response))
    return req, resp, response


def test_verify_green_on_a_saved_exchange_red_on_a_tampered_one(demo, tmp_path, capsys):
    req, resp, response = _saved(demo, tmp_path, CHAT)
    assert main(["verify", str(req), str(resp), "--url", demo.url]) == 0
    out = capsys.readouterr().out
    assert "verify: PASS" in out and "choice 1:" in out and response["system_fingerprint"] in out
    ids = response["choices"][1]["token_ids"]
    ids[3] = (ids[3] + 1) % 2048  # one token changed
    resp.write_text(json.dumps(response))
    assert main(["verify", str(req), str(resp), "--url", demo.url]) == 1
    assert "choice 1: token ids differ at position 3" in capsys.readouterr().out


def test_verify_without_ids_fails(demo, tmp_path, capsys):
    body = {k: v for k, v in CHAT.items() if k != "return_token_ids"}
    req, resp, _ = _saved(demo, tmp_path, body)
    assert main(["verify", str(req), str(resp), "--url", demo.url]) == 1
    assert "no token_ids" in capsys.readouterr().out


def test_verify_local_replays_in_process(demo, tmp_path, capsys):
    req, resp, _ = _saved(demo, tmp_path, CHAT)
    assert (
        main(["verify", str(req), str(resp), "--local", "--device", "cpu", "--context", "1024"])
        == 0
    )
    out = capsys.readouterr().out
    assert "verify: PASS" in out and "differs" not in out


def test_the_missing_seed_is_noted_only_where_it_can_matter(demo, tmp_path, capsys):
    """A greedy request (temperature 0, or none: the demo's default is greedy) that replays equal
    gets no seed note; a sampled one without a seed, or a default one that differs, does."""
    note = "the request has no seed"
    no_seed = {k: v for k, v in CHAT.items() if k not in ("seed", "n")}
    for temperature, noted in ((0, False), (None, False), (0.7, True)):
        body = dict(no_seed, temperature=temperature)
        if temperature is None:
            del body["temperature"]
        req, resp, response = _saved(demo, tmp_path, body)
        main(["verify", str(req), str(resp), "--url", demo.url])
        assert (note in capsys.readouterr().out) is noted, temperature
    default = {k: v for k, v in no_seed.items() if k != "temperature"}
    req, resp, response = _saved(demo, tmp_path, default)
    response["choices"][0]["token_ids"][0] += 1
    resp.write_text(json.dumps(response))
    assert main(["verify", str(req), str(resp), "--url", demo.url]) == 1
    assert note in capsys.readouterr().out
