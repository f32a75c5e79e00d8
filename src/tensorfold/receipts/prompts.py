"""The fixed prompts of the receipts: decode (code and chat), prefill text, fidelity prompts."""

from __future__ import annotations

from dataclasses import dataclass

# Herman Melville, Moby-Dick (1851), chapter 1: public domain. Repeated, it makes the prefill
# arrays and the long prompts of the cancellation check.
PARAGRAPH = (
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money "
    "in my purse, and nothing particular to interest me on shore, I thought I would sail about "
    "a little and see the watery part of the world. It is a way I have of driving off the "
    "spleen and regulating the circulation. Whenever I find myself growing grim about the "
    "mouth; whenever it is a damp, drizzly November in my soul; whenever I find myself "
    "involuntarily pausing before coffin warehouses, and bringing up the rear of every funeral "
    "I meet; then, I account it high time to get to sea as soon as I can. "
)


@dataclass(frozen=True)
class RequestStyle:
    """Fields sent beyond the OpenAI core; peers that do not know them ignore them."""

    token_ids: bool = True  # return_token_ids: exact token hashes where the server sends ids
    ignore_eos: bool = True  # every request runs to max_tokens, so runs compare like for like


@dataclass(frozen=True)
class Prompt:
    """A raw completion prompt, or a user message rendered by the chat template, thinking off."""

    name: str
    text: str
    chat: bool
    ids: tuple[int, ...] = ()  # a completion prompt sent as these token ids instead of text

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"

    def body(
        self,
        model: str,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
        style: RequestStyle = RequestStyle(),
    ) -> dict:
        body: dict = {
            "model": model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "stream_options": {"include_usage": True},
        }
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.text}]
            body["chat_template_kwargs"] = {"enable_thinking": False}
        else:
            body["prompt"] = list(self.ids) if self.ids else self.text
        if style.token_ids:
            body["return_token_ids"] = True
        if style.ignore_eos:
            body["ignore_eos"] = True
        return body


CODE = Prompt(
    "code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', chat=False
)
CHAT = Prompt("chat", "Explain how a GPU runs thousands of threads at once.", chat=True)
DECODE_PROMPTS = (CODE, CHAT)

FIDELITY_PROMPTS = (
    Prompt(
        "copy",
        "Copy this text exactly:\nCall me Ishmael. Some years ago, never mind how "
        "long precisely, having little or no money in my purse, I thought I would "
        "sail about a little and see the watery part of the world.",
        chat=True,
    ),
    Prompt("arithmetic", "What is 4837 × 29 + 1562? Work it out step by step.", chat=True),
    Prompt(
        "story",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        chat=True,
    ),
    Prompt(
        "code",
        "Write a Python function that merges two sorted lists into one sorted list, "
        "with a docstring and a test.",
        chat=True,
    ),
)


def pick(prompts: tuple[Prompt, ...], names: str | None) -> tuple[Prompt, ...]:
    """The prompts named in a comma list (all of them for None), in the list's order."""
    if not names:
        return prompts
    by_name = {p.name: p for p in prompts}
    unknown = [n for n in names.split(",") if n not in by_name]
    if unknown:
        raise ValueError(f"unknown prompt {unknown[0]!r}: choose from {', '.join(by_name)}")
    return tuple(by_name[n] for n in names.split(","))
