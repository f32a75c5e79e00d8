"""The demo model's data and tokenizer: seeded tasks with right answers, Qwen3.5 chat format."""

from __future__ import annotations

import calendar
import re
from pathlib import Path

import pytest

from tensorfold.demo import KINDS, DemoMissing, demo_checkpoint
from tensorfold.demo.data import FAMILIES, KNOWN_ANSWERS, Sample, Task, corpus, generate
from tensorfold.demo.spec import VOCAB_SIZE, ModelSpec
from tensorfold.demo.tables import CAPITALS, ELEMENTS
from tensorfold.demo.tokenizer import (
    CONTROL_TOKENS,
    control_token_ids,
    save_tokenizer,
    train_tokenizer,
)

# Written out by hand, not taken from the tables: the facts the known answers must state.
FACTS = {
    "What is the capital of France?": "Paris",
    "What is the capital of Japan?": "Tokyo",
    "What is the chemical symbol for iron?": "Fe",
    "Which element has the symbol Na?": "Sodium",
    "How many days are in a leap year?": "366",
}
UNIT_FACTORS = {
    ("centimetres", "metres"): 100,
    ("millimetres", "centimetres"): 10,
    ("metres", "kilometres"): 1000,
    ("grams", "kilograms"): 1000,
    ("millilitres", "litres"): 1000,
    ("minutes", "hours"): 60,
    ("seconds", "minutes"): 60,
    ("hours", "days"): 24,
    ("days", "weeks"): 7,
    ("months", "years"): 12,
    ("inches", "feet"): 12,
    ("feet", "yards"): 3,
}
REGULAR_UNITS = (
    "metre",
    "centimetre",
    "kilometre",
    "millimetre",
    "kilogram",
    "gram",
    "litre",
    "millilitre",
    "hour",
    "minute",
    "second",
    "day",
    "week",
    "month",
    "year",
)
PLURAL = {"foot": "feet", "inch": "inches"} | {unit: unit + "s" for unit in REGULAR_UNITS}


def _units(small: str, big: str, n: int) -> str:
    """How many `small` in n `big`; or, when only the reverse pair is known, n `small` as `big`."""
    small, big = PLURAL.get(small, small), PLURAL.get(big, big)
    if (small, big) in UNIT_FACTORS:
        return str(n * UNIT_FACTORS[small, big])
    factor = UNIT_FACTORS[big, small]
    assert n % factor == 0
    return str(n // factor)


SOLVERS = [
    (r"(?:What is |Compute )?(\d+) \+ (\d+)(?:\?|\.| = \?)", lambda a, b: str(int(a) + int(b))),
    (r"(?:What is |Compute )?(\d+) × (\d+)(?:\?|\.| = \?)", lambda a, b: str(int(a) * int(b))),
    (
        r"(?:Reverse the word ([a-z]+)|(?:Spell|Write) ([a-z]+) backwards)\.",
        lambda a, b: (a or b)[::-1],
    ),
    (r"(?:Repeat|Copy|Write) the word ([a-z]+)\.", lambda w: w),
    (r"(?:Copy this line|Repeat this line exactly): (.+)", lambda line: line),
    (
        r"(?:Reverse the order of the words|Write these words in reverse order): (.+)",
        lambda line: " ".join(line.split()[::-1]),
    ),
    (
        r"(?:How many times does the letter|Count the letter) ([a-z]) (?:appear )?in ([a-z]+)[?.]",
        lambda c, w: str(w.count(c)),
    ),
    (r"How many letters (?:are in|does) ([a-z]+)(?: have)?\?", lambda w: str(len(w))),
    (
        r"How many days are in the year (\d+)\?",
        lambda y: "366" if calendar.isleap(int(y)) else "365",
    ),
    (r"Is (\d+) a leap year\?", lambda y: "Yes" if calendar.isleap(int(y)) else "No"),
    (r"How many days are in a (leap|common) year\?", lambda k: "366" if k == "leap" else "365"),
    (r"How many ([a-z]+) are in (\d+) ([a-z]+)\?", lambda s, n, b: _units(s, b, int(n))),
]


def solve(task: Task) -> str | None:
    """An answer computed from the prompt text alone, where the family allows one."""
    if task.prompt in FACTS:
        return FACTS[task.prompt]
    for pattern, f in SOLVERS:
        m = re.fullmatch(pattern, task.prompt)
        if m:
            return f(*m.groups())
    return None


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = train_tokenizer(corpus(generate(0, 3000)), 700)
    return save_tokenizer(tok, tmp_path_factory.mktemp("demo_tokenizer"))


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


def test_generate_is_a_function_of_the_seed() -> None:
    a, b = generate(11, 400), generate(11, 400)
    assert a == b
    assert generate(11, 100) == a[:100]
    assert generate(12, 400) != a
    assert {s.thinking for s in a} == {True, False}
    assert any(s.system is not None for s in a)


def test_every_family_is_sampled_and_covered_by_known_answers() -> None:
    sampled = {s.task.family for s in generate(3, 2000)}
    assert sampled == set(FAMILIES)
    assert {t.family for t in KNOWN_ANSWERS} == set(FAMILIES)
    assert len(KNOWN_ANSWERS) >= 14
    assert len({t.prompt for t in KNOWN_ANSWERS}) == len(KNOWN_ANSWERS)


@pytest.mark.parametrize("task", KNOWN_ANSWERS, ids=lambda t: t.prompt)
def test_known_answer_is_right(task: Task) -> None:
    assert solve(task) == task.answer


def test_generated_answers_are_right() -> None:
    checked = 0
    for s in generate(5, 3000, known_rate=0.0):
        expected = solve(s.task)
        if expected is None:  # capitals, elements, reverse look-ups: checked against the tables
            continue
        assert s.task.answer == expected, s.task
        checked += 1
    assert checked > 2000


def test_tables_give_one_answer_per_question() -> None:
    # Reverse look-ups (which country, which element) need both directions to be one-to-one.
    assert len(set(CAPITALS.values())) == len(CAPITALS)
    assert len({e.symbol for e in ELEMENTS}) == len({e.number for e in ELEMENTS}) == len(ELEMENTS)
    by_symbol = {e.symbol: e for e in ELEMENTS}
    facts = (by_symbol["Fe"].name, by_symbol["Na"].number, by_symbol["Au"].name)
    assert facts == ("iron", 11, "gold")


def test_traces_end_in_the_answer() -> None:
    for s in generate(6, 1500, known_rate=0.0):
        if s.task.family in ("add", "mul", "count_letter", "word_length", "unit"):
            last_step = s.task.trace.split("=")[-1]
            assert re.search(rf"\b{re.escape(s.task.answer)}\b", last_step), s.task


def test_known_answers_are_in_the_training_mix() -> None:
    seen = {s.task.prompt for s in generate(0, 20000)}
    assert all(t.prompt in seen for t in KNOWN_ANSWERS)


def test_control_tokens_are_single_ids_after_the_merges(tokenizer_dir: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ids = control_token_ids(tok)
    assert list(ids.values()) == list(range(700, 700 + len(CONTROL_TOKENS)))
    text = "".join(c for c, _ in CONTROL_TOKENS)
    assert tok.encode(text).ids == list(ids.values())
    assert tok.decode(list(ids.values()), skip_special_tokens=False) == text
    # <think>/</think> and the tool markers survive skip_special_tokens; ChatML ones do not.
    kept = [c for c, special in CONTROL_TOKENS if not special]
    assert tok.decode(list(ids.values()), skip_special_tokens=True) == "".join(kept)


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("system", [None, "You are a helpful assistant."])
def test_chat_template_renders_the_training_prompt(
    hf_tokenizer, thinking: bool, system: str | None
) -> None:
    sample = Sample(KNOWN_ANSWERS[2], thinking, system)
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": sample.task.prompt})
    text = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    assert text == sample.prompt_text()
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    tail = "<think>\n" if thinking else "<think>\n\n</think>\n\n"
    user = "<|im_start|>user\nWhat is 17 × 23?<|im_end|>\n"
    assert text == f"{head}{user}<|im_start|>assistant\n{tail}"


def test_thinking_is_on_by_default(hf_tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize("thinking", [True, False])
def test_a_finished_turn_renders_prompt_plus_reply(hf_tokenizer, thinking: bool) -> None:
    sample = Sample(KNOWN_ANSWERS[4], thinking)
    reply = {"role": "assistant", "content": sample.task.answer}
    if thinking:
        reply["reasoning_content"] = sample.task.trace
    messages = [{"role": "user", "content": sample.task.prompt}, reply]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == sample.prompt_text() + sample.completion_text() + "\n"


def test_prompt_and_reply_encode_apart_as_together(tokenizer_dir: Path, hf_tokenizer) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    for s in generate(21, 600):
        prompt, reply = s.prompt_text(), s.completion_text()
        apart = tok.encode(prompt).ids + tok.encode(reply).ids
        assert apart == tok.encode(prompt + reply).ids, s
    s = Sample(KNOWN_ANSWERS[0], True)
    hf_ids = hf_tokenizer.encode(s.prompt_text(), add_special_tokens=False)
    assert hf_ids == tok.encode(s.prompt_text()).ids


def test_demo_checkpoint_names_a_missing_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="expected one of"):
        demo_checkpoint("fp8")
    monkeypatch.setitem(KINDS, "bf16", "not-shipped")
    with pytest.raises(DemoMissing, match="not-shipped"):
        demo_checkpoint("bf16")


def test_model_spec_fits_the_repository_and_mlx_4bit() -> None:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**ModelSpec().text_config(VOCAB_SIZE, {"<|endoftext|>": 0}))
    model = Qwen3_5ForCausalLM(config)
    n = sum(p.numel() for p in model.parameters())
    assert 5_000_000 <= n <= 15_000_000
    assert 2 * n < 16 * 2**20  # the bf16 file
    assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"] + [
        "linear_attention"
    ] * 3 + ["full_attention"]
    # mlx_lm quantizes a module only when its input width is a multiple of the group (64).
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.in_features % 64 == 0 for m in linears)
    assert model.model.embed_tokens.embedding_dim % 64 == 0
    assert model.lm_head.weight is model.model.embed_tokens.weight
