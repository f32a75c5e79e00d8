"""Every limit the server puts on what a client may send, in one place (docs/server.md lists them
with their flags). Sizes are bytes, times seconds."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

KIB, MIB = 1 << 10, 1 << 20
PROMPT_BYTES_PER_TOKEN = 32  # a prompt of --context tokens fits, JSON escapes included
MIN_PROMPT_BYTES = 64 * KIB
TOKENS_PER_OBJECT = 4  # a message or content part renders to at least this many tokens
MIN_JSON_OBJECTS = 4096
MAX_STOP_STRINGS = 16  # the stop check runs per token on the engine thread: keep it short
MAX_STOP_CHARS = 128
MAX_STOP_TOKEN_IDS = 1024
MAX_TEMPERATURE = 100.0  # past this every token is equally likely: uniform noise
MAX_KWARG_CHARS = 1024  # a chat_template_kwargs string value
CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ConnectionLimits:
    """What one HTTP connection may hold: uvicorn's h11 protocol enforces these (connections.py)."""

    header_timeout_s: float = 10.0  # a request's line and headers, from its first byte
    body_timeout_s: float = 60.0  # its whole body, from the end of its headers
    keep_alive_s: float = 5.0  # idle between requests
    max_connections: int = 512  # open at once; past it each request gets a 503


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 16 * MIB  # any request body
    max_prompt_bytes: int = 2 * MIB  # the body of a request that carries a prompt
    prompt_timeout_s: float = 10.0  # rendering and tokenizing one request's prompts
    trust_request_chat_template: bool = False
    max_template_bytes: int = 64 * KIB  # a request's own chat_template
    template_timeout_s: float = 2.0  # rendering it (in a child process that is killed)
    max_queue: int = 64  # the engine's queue: choices per request fit in it
    max_json_objects: int = 16384  # objects in one body (validation pays per object)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    @classmethod
    def for_context(cls, context: int, max_queue: int, **overrides) -> Limits:
        """The defaults for one server: the prompt cap follows --context."""
        prompt = max(context * PROMPT_BYTES_PER_TOKEN, MIN_PROMPT_BYTES)
        objects = max(context // TOKENS_PER_OBJECT, MIN_JSON_OBJECTS)
        return replace(
            cls(max_prompt_bytes=prompt, max_queue=max_queue, max_json_objects=objects), **overrides
        )

    def check(self) -> None:
        """Refuses settings under which a limit could not do its job."""
        if (
            min(
                self.max_body_bytes,
                self.max_prompt_bytes,
                self.max_template_bytes,
                self.max_json_objects,
            )
            < 1
        ):
            raise ValueError("size limits must be positive")
        if self.prompt_timeout_s <= 0:
            raise ValueError("the prompt timeout must be positive")
        if self.trust_request_chat_template and not (
            0 < self.template_timeout_s < self.prompt_timeout_s
        ):
            raise ValueError(
                "the template timeout must be positive and below the prompt timeout "
                "(a request's template renders within its prompt's time)"
            )
        c = self.connections
        if min(c.header_timeout_s, c.body_timeout_s, c.keep_alive_s) <= 0 or c.max_connections < 1:
            raise ValueError("connection timeouts and the connection cap must be positive")


_UNITS = {"": 1, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB, "g": 1 << 30, "gib": 1 << 30}


def parse_bytes(text: str) -> int:
    """'65536', '64KiB', '16M' -> bytes (binary units)."""
    found = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = found and _UNITS.get(found.group(2).lower())
    if not unit:
        raise ValueError(f"not a size: {text!r} (e.g. 65536, 64KiB, 16MiB)")
    return int(found.group(1)) * unit


def add_flags(p) -> None:
    """The serve command's flags for these limits and the API key."""
    d, c = Limits(), ConnectionLimits()
    p.add_argument(
        "--api-key",
        default=None,
        help="require Authorization: Bearer KEY (default: $TENSORFOLD_API_KEY; a "
        "file or the environment keeps it out of the process list)",
    )
    p.add_argument("--api-key-file", default=None, help="read the API key from this file")
    p.add_argument(
        "--max-body-bytes",
        type=parse_bytes,
        default=d.max_body_bytes,
        help="largest request body (413 past it, before it is read)",
    )
    p.add_argument(
        "--max-prompt-bytes",
        type=parse_bytes,
        default=None,
        help=f"largest body of a request with a prompt (default: "
        f"{PROMPT_BYTES_PER_TOKEN} bytes per --context token, at least 64KiB)",
    )
    p.add_argument(
        "--prompt-timeout",
        type=float,
        default=d.prompt_timeout_s,
        help="seconds to render and tokenize one request's prompts (503 past it)",
    )
    p.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let a request bring its own chat_template (rendered in a sandboxed, "
        "time- and memory-limited child process)",
    )
    p.add_argument(
        "--max-template-bytes",
        type=parse_bytes,
        default=d.max_template_bytes,
        help="largest chat_template a request may bring",
    )
    p.add_argument(
        "--template-timeout",
        type=float,
        default=d.template_timeout_s,
        help="seconds a request's own chat template may render",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=c.header_timeout_s,
        help="seconds for a request's line and headers to arrive",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=c.body_timeout_s,
        help="seconds for a request's body to arrive, after its headers",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=c.keep_alive_s,
        help="seconds an idle connection stays open between requests",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=c.max_connections,
        help="open connections; past it each request gets a 503",
    )


def from_args(args, context: int, max_queue: int) -> Limits:
    connections = ConnectionLimits(
        args.header_timeout, args.body_timeout, args.keep_alive_timeout, args.max_connections
    )
    given = {"max_prompt_bytes": args.max_prompt_bytes} if args.max_prompt_bytes else {}
    limits = Limits.for_context(
        context,
        max_queue,
        max_body_bytes=args.max_body_bytes,
        prompt_timeout_s=args.prompt_timeout,
        trust_request_chat_template=args.trust_request_chat_template,
        max_template_bytes=args.max_template_bytes,
        template_timeout_s=args.template_timeout,
        connections=connections,
        **given,
    )
    limits.check()
    return limits
