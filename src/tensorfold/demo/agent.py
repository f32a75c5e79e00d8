"""Tool calls and JSON answers for the demo model, as extra training families (off unless a
training run asks for them: `generate` with `agent_rate` 0 draws exactly `data.generate`'s
samples, those of the bundled weights).

Each sample renders exactly as the demo's chat template renders the same messages (checked by
tests/test_demo_agent.py), so a served request with `tools` sees the prompts the model learned:
- tool_call: the tools in the system block, a question; the reply is one `<tool_call>` block.
- tool_answer: the same turn, the call, the tool's result in a `<tool_response>`; the reply is
  the answer (the result itself).
- json: a system message asking for JSON; the reply is `{"answer": ...}`.
- json_object (only when a run asks for a share of it): the plain question, as a client sends it
  under `response_format: json_object` alone; the reply is `{"answer": ...}`, its first token not
  learned (the server's grammar forces the opening brace), so a free reply stays the plain answer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from .data import (
    IM_END,
    IM_START,
    KNOWN_RATE,
    SYSTEM_RATE,
    THINK_CLOSE,
    THINK_OPEN,
    THINKING_RATE,
    Sample,
    Task,
    sample_task,
)
from .tables import CAPITALS, SYSTEM_PROMPTS

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + and ×.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
CAPITAL_OF = {
    "type": "function",
    "function": {
        "name": "capital_of",
        "description": "The capital city of a country.",
        "parameters": {
            "type": "object",
            "properties": {"country": {"type": "string"}},
            "required": ["country"],
        },
    },
}
TOOLS = (CALCULATOR, CAPITAL_OF)
JSON_SYSTEM = 'Answer with a JSON object: {"answer": ...}.'
TOOL_PREAMBLE = (
    "# Tools\n\nYou have access to the following functions:\n\n<tools>{tools}\n</tools>\n\n"
    "If you choose to call a function ONLY reply in the following format:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n</function>\n</tool_call>"
)


def call_text(name: str, args: dict[str, str]) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


@dataclass(frozen=True)
class ToolUse:
    """A question a tool answers: the call to make and the result it returns."""

    task: Task
    name: str
    args: dict[str, str]
    result: str


def tool_use(rng: random.Random) -> ToolUse:
    if rng.random() < 0.5:
        country = rng.choice(sorted(CAPITALS))
        task = Task(f"Use a tool: what is the capital of {country}?", CAPITALS[country], "", "")
        return ToolUse(task, "capital_of", {"country": country}, CAPITALS[country])
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    sym, value = ("×", a * b) if rng.random() < 0.5 else ("+", a + b)
    task = Task(f"Use the calculator: what is {a} {sym} {b}?", str(value), "", "")
    return ToolUse(task, "calculator", {"expression": f"{a} {sym} {b}"}, str(value))


@dataclass(frozen=True)
class AgentSample:
    """One training turn of an agent family; the same interface as data.Sample."""

    task: Task  # family tool_call, tool_answer or json
    thinking: bool
    system: str | None
    tools: bool = False
    history: str = ""  # earlier turns of this chat, as the template renders them
    reply: str = ""
    forced_lead: bool = False  # the reply's first token is a grammar's, not the model's

    def prompt_text(self) -> str:
        head = ""
        if self.tools:
            listed = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in TOOLS)
            system = f"{self.system}\n\n" if self.system else ""
            head = f"{IM_START}system\n{system}{TOOL_PREAMBLE.format(tools=listed)}{IM_END}\n"
        elif self.system is not None:
            head = f"{IM_START}system\n{self.system}{IM_END}\n"
        opening = f"{THINK_OPEN}\n" if self.thinking else f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"
        user = f"{IM_START}user\n{self.task.prompt}{IM_END}\n"
        return f"{head}{user}{self.history}{IM_START}assistant\n{opening}"

    def completion_text(self) -> str:
        return f"{self.trace_text()}{self.reply}{IM_END}"

    def trace_text(self) -> str:
        """The completion before the reply: the trace and its closing, when thinking."""
        return f"{self.task.trace}\n{THINK_CLOSE}\n\n" if self.thinking else ""


def _json_value(answer: str):
    return int(answer) if answer.lstrip("-").isdigit() else answer


def as_json_object(task: Task, thinking: bool, system: str | None = None) -> AgentSample:
    """`task` asked as a client asks it under `response_format: json_object` alone, answered
    as the JSON object that grammar lets through."""
    reply = json.dumps({"answer": _json_value(task.answer)}, ensure_ascii=False)
    task = Task(task.prompt, reply, task.trace, "json_object")
    return AgentSample(task, thinking, system, False, "", reply, forced_lead=True)


def json_object_sample(rng: random.Random, thinking: bool) -> AgentSample:
    """A question as the original families ask it (known answers too, a system prompt
    sometimes), in the json_object family."""
    task = sample_task(rng)
    system = rng.choice(SYSTEM_PROMPTS) if rng.random() < SYSTEM_RATE else None
    return as_json_object(task, thinking, system)


def agent_sample(rng: random.Random, thinking: bool, json_object_rate: float = 0.0) -> AgentSample:
    """One of the three families, a third each (after a share `json_object_rate` of
    json_object samples; at 0 no number is drawn for it); traces only where the task has one."""
    if json_object_rate and rng.random() < json_object_rate:
        return json_object_sample(rng, thinking)
    kind = rng.random()
    if kind < 2 / 3:
        use = tool_use(rng)
        trace = f"I call {use.name}."
        call = call_text(use.name, use.args)
        if kind < 1 / 3:
            task = Task(use.task.prompt, call, trace, "tool_call")
            return AgentSample(task, thinking, None, True, "", call)
        past = f"{IM_START}assistant\n{THINK_OPEN}\n\n{THINK_CLOSE}\n\n{call}{IM_END}\n"
        response = f"{IM_START}user\n<tool_response>\n{use.result}\n</tool_response>{IM_END}\n"
        task = Task(use.task.prompt, use.result, f"The tool returned {use.result}.", "tool_answer")
        return AgentSample(task, thinking, None, True, past + response, use.result)
    task = sample_task(rng, known_rate=0.0)
    reply = json.dumps({"answer": _json_value(task.answer)}, ensure_ascii=False)
    return AgentSample(
        Task(task.prompt, reply, task.trace, "json"), thinking, JSON_SYSTEM, False, "", reply
    )


def generate(
    seed: int,
    n: int,
    known_rate: float = KNOWN_RATE,
    agent_rate: float = 0.0,
    json_object_rate: float = 0.0,
) -> list[Sample | AgentSample]:
    """data.generate with a share `agent_rate` of agent samples (a share `json_object_rate` of
    those json_object ones); at 0 no number is drawn for them, so the samples are
    data.generate's."""
    rng = random.Random(seed)
    out: list[Sample | AgentSample] = []
    for _ in range(n):
        if agent_rate and rng.random() < agent_rate:
            out.append(agent_sample(rng, rng.random() < THINKING_RATE, json_object_rate))
            continue
        task = sample_task(rng, known_rate)
        thinking = rng.random() < THINKING_RATE
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < SYSTEM_RATE else None
        out.append(Sample(task, thinking, system))
    return out
