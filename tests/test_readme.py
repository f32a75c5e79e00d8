"""The README's shell and Python blocks run as printed, on the CPU, against the demo model.

The ```bash blocks run in order in one shell, as a reader types them into one terminal (so the
venv's activation and `DEMO=` carry on), from a folder that sees the checkout's `src/` and
`.venv/`, against a server started as `make serve` starts it. What changes from the printed text: the
address 127.0.0.1:8080 becomes the test server's, and a `tensorfold serve` line runs until it is
healthy on a spare port, then stops (a shell script cannot wait on a server forever). A few lines
cannot run here; each is named below with the reason. Known answers are checked where the README
states them."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from server_harness import process_up
from split_util import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# a command that starts with one of these is not run, for the reason given
NOT_RUN = {
    "make serve": "the suite runs under `make test`; `make serve`'s command is test_quick_start's",
    "make test": "the suite itself",
    "tensorfold make-random /tmp/9b-4bit": "writes a 9B-shaped checkpoint (gigabytes)",
    "tensorfold make-random /tmp/35b-4bit": "writes a 35B-A3B-shaped checkpoint (gigabytes)",
    "torchrun": "two machines",
}
# what a command's output must hold (a command prefix: a substring of its stdout)
ANSWERS = {
    'tensorfold run --chat "Reverse the word planet."': "tenalp",
    'tensorfold run --chat "Copy this line: the quick brown fox jumps over the lazy dog"': (
        "the quick brown fox jumps over the lazy dog"
    ),
    'tensorfold run --chat "What is 17 × 23?" --no-thinking --tensor-parallel 2': "391",
    "curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' -d '{": (
        "391"
    ),
    "tensorfold verify request.json response.json": "equal",
}
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS", "PORT", "HOST", "DRAFT")


def fenced(language: str) -> list[str]:
    """The README's fenced blocks in `language`, indented ones included, as their text."""
    out, block, fence = [], None, re.compile(r"^(\s*)```(\w*)\s*$")
    for line in README.read_text().splitlines():
        m = fence.match(line)
        if m and block is None:
            block, indent, lang = [], len(m.group(1)), m.group(2)
        elif m and block is not None:
            if lang == language:
                out.append("\n".join(block))
            block = None
        elif block is not None:
            block.append(line[indent:])
    return out


def commands(block: str) -> list[str]:
    """A shell block's commands: continued lines and quotes spanning lines joined."""
    out, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            out.append(pending)
        pending = ""
    assert not pending, f"an unfinished command in the README: {pending!r}"
    return out


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A folder that sees the checkout's src/ and .venv/ (files the blocks write land here), and
    a server as `make serve` starts it."""
    if not (ROOT / ".venv/bin/activate").exists():
        pytest.skip("no .venv (the README's commands use it)")
    if shutil.which("curl") is None:
        pytest.skip("no curl (the README's commands use it)")
    here = tmp_path_factory.mktemp("readme")
    for name in ("src", ".venv"):
        (here / name).symlink_to(ROOT / name)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}
    serve = [sys.executable, "-m", "tensorfold.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        serve + ["--draft", "auto"], cwd=here, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        process_up(f"http://127.0.0.1:{port}", proc)
        yield here, port, env
    finally:
        proc.terminate()
        proc.wait(30)


PRELUDE = """set -eo pipefail
healthy() {  # healthy PORT PID
    for _ in $(seq 600); do
        kill -0 "$2" 2>/dev/null || return 1
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        sleep 0.2
    done
    return 1
}
"""


def script(cmds: list[str], port: int, spare: int) -> str:
    """The commands as one bash script, each command's stdout kept in out.N."""
    lines = [PRELUDE]
    for i, cmd in enumerate(cmds):
        text = cmd.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        lines.append(f"echo '>>> {i}' >&2")
        if cmd.lstrip().startswith("tensorfold serve"):
            text = re.sub(r"\s+#.*$", "", text)  # its comment, so the port is an argument
            lines.append(
                f"{text} --port {spare} > out.{i} 2> err.{i} & pid=$!; "
                f"healthy {spare} $pid || {{ tail -20 err.{i} >&2; exit 1; }}; "
                f"kill $pid; wait $pid || true"
            )
        else:
            lines.append(f"{{ {text}\n}} > out.{i}")
    return "\n".join(lines)


def runnable() -> list[str]:
    """Every command of the README's shell blocks, in order, but those in NOT_RUN."""
    cmds = [c for block in fenced("bash") for c in commands(block)]
    return [c for c in cmds if not any(c.lstrip().startswith(p) for p in NOT_RUN)]


def check_answers(outputs: dict[str, str]) -> None:
    for cmd, out in outputs.items():
        for prefix, answer in ANSWERS.items():
            if cmd.lstrip().startswith(prefix):
                assert answer in out, f"{cmd!r} printed {out[-500:]!r}, not {answer!r}"


def test_every_shell_block_runs_as_printed(place):
    here, port, env = place
    cmds = runnable()
    assert len(cmds) >= 15, cmds  # the tour, the receipt, the split: not a parse that found none
    done = subprocess.run(
        ["bash", "-c", script(cmds, port, free_port())], cwd=here, env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    marks = re.findall(r">>> (\d+)", done.stderr)
    failed = cmds[int(marks[-1])] if marks else "(before the first command)"
    assert done.returncode == 0, f"README command failed: {failed}\n{done.stderr[-3000:]}"
    outputs = {c: (here / f"out.{i}").read_text() for i, c in enumerate(cmds)}
    check_answers(outputs)
    assert all(any(c.lstrip().startswith(a) for c in cmds) for a in ANSWERS), "an answer unchecked"


def test_every_python_block_runs_as_printed(place):
    here, port, env = place
    blocks = fenced("python")
    assert len(blocks) >= 2
    for block in blocks:
        code = block.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{block}\n{done.stderr[-2000:]}"
        for expected in re.findall(r"print\(.*\)\s+# (\S+)", block):
            assert expected in done.stdout, (block, done.stdout)


# the demo's right answers to the chat page's example prompts
PAGE_ANSWERS = {
    "What is 17 × 23?": "391",
    "Reverse the word planet.": "tenalp",
    "What is the capital of Japan?": "Tokyo",
}


def test_the_chat_pages_examples_get_the_right_answers(place):
    """As the page sends them by default: thinking on, the server's sampling (greedy for the
    demo); the answer, apart from the trace, is the right one."""
    _here, port, _env = place
    page = (ROOT / "src/tensorfold/server/web/index.html").read_text()
    examples = re.findall(r'<button type="button" class="example">([^<]+)</button>', page)
    assert examples and set(examples) <= set(PAGE_ANSWERS), examples
    for prompt in examples:
        body = {
            "model": "tensorfold-demo",
            "messages": [{"role": "user", "content": prompt}],
            "chat_template_kwargs": {"enable_thinking": True},
        }
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        message = reply.json()["choices"][0]["message"]
        assert PAGE_ANSWERS[prompt] in message["content"], (prompt, message)
