"""Renders a request's own chat template for the server: one JSON job per line on stdin, one JSON
answer per line on stdout. Run as a script (`python -I template_child.py MEMORY MAX_OUTPUT`): it
imports only the standard library and jinja2, caps its own address space, and the server kills it
at the time limit, so no template can hold the server's memory or time."""

from __future__ import annotations

import json
import os
import resource
import sys
from collections import OrderedDict
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

MAX_POWER = 256  # ** with a larger exponent could build an enormous integer
COMPILED = 8  # templates kept compiled (most clients send the same one)


class LimitError(Exception):
    pass


class Generation(Extension):
    """{% generation %}...{% endgeneration %} (Hugging Face's assistant mask): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox; repetition and powers are checked before they allocate."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, max_output: int) -> None:
        super().__init__(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, Generation]
        )
        self.max_output = max_output
        self.filters["tojson"] = _tojson
        self.globals.update(
            raise_exception=_raise, strftime_now=_now, namespace=Namespace, dict=_dict
        )

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_POWER:
            raise LimitError(f"an exponent of {right} is past the limit of {MAX_POWER}")
        if operator == "*":
            sized, times = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
            if (
                isinstance(sized, (str, list, tuple))
                and isinstance(times, int)
                and len(sized) * times > self.max_output
            ):
                raise LimitError(
                    f"a repetition of {len(sized) * times} items is past the "
                    f"limit of {self.max_output}"
                )
        return super().call_binop(context, operator, left, right)


class Namespace(jinja2.utils.Namespace):
    """jinja2's namespace without underscore names (as Hugging Face's templates get it)."""

    def __init__(*args, **kwargs):
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a namespace may not hold {name!r}")


def _dict(*args, **kwargs):
    return dict(*args, **kwargs)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message):
    raise jinja2.TemplateError(message)


def _now(fmt):
    return datetime.now().strftime(fmt)


def render(env: LimitedEnvironment, cache: OrderedDict, job: dict) -> str:
    source = job["template"]
    if source not in cache:
        cache[source] = env.from_string(source)
        if len(cache) > COMPILED:
            cache.popitem(last=False)
    cache.move_to_end(source)
    variables = {
        **job["special"],
        **job["kwargs"],
        "messages": job["messages"],
        "tools": None,
        "documents": None,
        "add_generation_prompt": job["add_generation_prompt"],
    }
    out, size = [], 0
    for piece in cache[source].generate(**variables):  # stops as soon as the output is too big
        size += len(piece)
        if size > env.max_output:
            raise LimitError(f"the template renders more than {env.max_output} characters")
        out.append(piece)
    return "".join(out)


def answer(env: LimitedEnvironment, cache: OrderedDict, line: bytes) -> dict:
    try:
        return {"text": render(env, cache, json.loads(line))}
    except jinja2.TemplateSyntaxError as exc:
        return {"kind": "syntax", "error": f"line {exc.lineno}: {exc.message}"}
    except (LimitError, SecurityError) as exc:
        return {"kind": "limit", "error": str(exc)}
    except MemoryError:
        return {"kind": "limit", "error": "the template needs more memory than it may use"}
    except RecursionError:
        return {"kind": "limit", "error": "the template recurses too deeply"}
    except Exception as exc:  # the template's own error (raise_exception, a bad operation)
        return {"kind": "render", "error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    memory, max_output = int(sys.argv[1]), int(sys.argv[2])
    env, cache = LimitedEnvironment(max_output), OrderedDict()
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except (ValueError, OSError):  # a platform without the cap: the kill at the time limit stays
        pass
    os.nice(10)  # a looping template yields the CPU to the engine
    sys.stdout.write('{"ready": true}\n')  # the time limit runs from here, not from start
    sys.stdout.flush()
    for line in sys.stdin.buffer:
        reply = answer(env, cache, line)
        if "error" in reply:
            reply["error"] = reply["error"][:500]
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
