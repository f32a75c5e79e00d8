"""The bundled demo model answers its known questions: offline, through `tensorfold run`, over HTTP,
on the bf16 and the 4-bit files; transformers and mlx_lm agree; golden token hashes pin the arithmetic."""

import json

import pytest
import torch
from server_harness import start_server

from tensorfold.cli import main as cli_main
from tensorfold.demo import demo_checkpoint
from tensorfold.demo.data import KNOWN_ANSWERS
from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.models.loader import load_model
from tensorfold.receipts.known_answers import final_answer
from tensorfold.tokenizer import Tokenizer
from tensorfold.util import token_sha

GREEDY = SamplingParams(max_tokens=96, temperature=0.0)
FILES = ["bf16", "mlx-4bit"]

# sha256 of the reply ids (comma-separated decimals) to GOLDEN_PROMPTS, greedy, CPU. A change of
# the arithmetic moves them; a commit that moves them on purpose says so.
GOLDEN_PROMPTS = [
    ("What is 17 × 23?", True),
    ("Reverse the word planet.", False),
    ("Copy this line: the quick brown fox jumps over the lazy dog", True),
    ("What is 58 + 67?", False),
]
_HASHES = [
    "5874a9ec0e4bc40e9b00a2b21bd711996be60f9a2fbb601a3cc90eaa4345e6ff",
    "ec48d88c71760ea542dd77b9af4e91a0575475427d8ae07057d40853a99b881d",
    "ae9d9f048f3060a9fc4c491a131029dca6c3e4c720f0ad6cf319fe0606bf19f4",
    "5924c8bd9192f0bf47f801c74e49852a8d3bd0084c785488c1bd9b333e603afd",
]
GOLDENS = {"float32": _HASHES, "bfloat16": _HASHES}  # measured: both dtypes give the same replies


def _engine(kind: str, dtype=torch.float32) -> Engine:
    path = demo_checkpoint(kind)
    return Engine(
        load_model(path, dtype=dtype),
        Tokenizer(path),
        EngineConfig(parallel=8, context=512, chunk=64),
    )


def _ask_all(engine: Engine, prompts: list[tuple[str, bool]]) -> list[list[int]]:
    reqs = [
        engine.add_request(
            engine.tokenizer.chat([{"role": "user", "content": p}], enable_thinking=t), GREEDY
        )
        for p, t in prompts
    ]
    engine.run_until_done()
    assert all(r.finish_reason == "stop" for r in reqs)
    return [r.output_ids for r in reqs]


KNOWN = [(t.prompt, thinking) for thinking in (False, True) for t in KNOWN_ANSWERS]
ANSWERS = [t.answer for _ in (False, True) for t in KNOWN_ANSWERS]


@pytest.mark.parametrize("kind", FILES)
def test_known_answers_offline(kind):
    engine = _engine(kind)
    replies = [final_answer(engine.tokenizer.decode(ids)) for ids in _ask_all(engine, KNOWN)]
    wrong = [(p, a, r) for (p, _), a, r in zip(KNOWN, ANSWERS, replies) if r != a]
    assert len(KNOWN) >= 24 and not wrong


@pytest.mark.parametrize("kind", FILES)
def test_known_answers_through_tensorfold_run(kind, capsys):
    for prompt, thinking in [
        ("What is 17 × 23?", False),
        ("What is 17 × 23?", True),
        ("How many days are in a leap year?", False),
    ]:
        argv = ["run", str(demo_checkpoint(kind)), "--chat", prompt, "--json", "--max-tokens", "96"]
        assert cli_main(argv + ([] if thinking else ["--no-thinking"])) == 0
        out = json.loads(capsys.readouterr().out)
        assert final_answer(out["text"]) == {"What is 17 × 23?": "391"}.get(prompt, "366")
        assert out["finish_reason"] == "stop"


def test_run_chat_prints_the_answer_apart_from_the_trace(capsys):
    """`run --chat` with thinking on: the trace goes to stderr, stdout holds the answer alone
    (no literal </think>), and --json carries both as the server does."""
    argv = ["run", "--chat", "What is 17 × 23?", "--max-tokens", "96"]
    assert cli_main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "391" and "</think>" not in out
    assert err.strip().endswith("= 391.")
    assert cli_main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["content"].strip() == "391" and got["reasoning_content"].strip().endswith("= 391.")
    assert cli_main([*argv, "--no-thinking"]) == 0
    assert capsys.readouterr().out.strip() == "391"


@pytest.mark.parametrize("kind", FILES)
def test_known_answers_over_http(kind):
    from tensorfold.receipts.client import Endpoint
    from tensorfold.receipts.known_answers import KnownConfig, run_known

    server = start_server(_engine(kind), name="tensorfold-demo")
    try:
        records = run_known(KnownConfig(Endpoint(server.url), "tensorfold-demo", (False, True)))
    finally:
        server.stop()
    assert len(records) == 2 * len(KNOWN_ANSWERS)
    assert [r for r in records if not r["correct"]] == []


def test_transformers_agrees_on_the_bf16_file():
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = demo_checkpoint("bf16")
    ours = _ask_all(_engine("bf16"), KNOWN)
    tok = Tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    gen = GenerationConfig(
        do_sample=False, max_new_tokens=96, eos_token_id=list(tok.eos_ids), pad_token_id=0
    )
    for (prompt, thinking), mine in zip(KNOWN, ours):
        ids = torch.tensor(
            [tok.chat([{"role": "user", "content": prompt}], enable_thinking=thinking)]
        )
        with torch.no_grad():
            theirs = model.generate(ids, generation_config=gen)[0, ids.shape[1] :].tolist()
        assert theirs == mine, prompt


def test_mlx_lm_agrees_on_the_4bit_file():
    pytest.importorskip("mlx_lm")
    from mlx_lm import generate, load

    path = demo_checkpoint("mlx-4bit")
    model, tokenizer = load(str(path))
    asked = KNOWN[::2]  # every other task, both thinking modes: mlx_lm's CPU decode is slow
    ours = _ask_all(_engine("mlx-4bit", torch.bfloat16), asked)
    tok = Tokenizer(path)
    for (prompt, thinking), mine in zip(asked, ours):
        prompt_text = tok.hf.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=thinking,
        )
        theirs = generate(model, tokenizer, prompt_text, max_tokens=96, verbose=False)
        assert final_answer(theirs) == final_answer(tok.decode(mine)), prompt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_golden_token_hashes(dtype):
    replies = _ask_all(_engine("bf16", dtype), GOLDEN_PROMPTS)
    got = [token_sha(ids) for ids in replies]
    assert got == GOLDENS[str(dtype).removeprefix("torch.")]
