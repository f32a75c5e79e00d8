"""The `tensorfold` command: run (offline generation, seams), serve, verify, make-random, bench,
check."""

from __future__ import annotations

import argparse
import sys

from .engine.flags import add_model_flags
from .errors import TensorFoldError


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="generate from one prompt, offline")
    add_model_flags(
        p, None, "prompt + generation limit (default: the prompt and --max-tokens, at least 4096)"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw text prompt")
    src.add_argument("--chat", help="a user message, rendered with the chat template")
    src.add_argument("--tokens", help="token ids: a JSON list, or a file holding one")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument(
        "--no-thinking", action="store_true", help="chat template with enable_thinking=False"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--compare-chunk",
        type=int,
        default=None,
        help="run again with this chunk and compare seams",
    )
    p.add_argument("--seams", type=int, default=256, help="fingerprint every N prompt rows")
    from .drafters.choice import add_flags

    add_flags(p)
    from .tools.run import run_command

    p.set_defaults(func=run_command)


def _verify_parser(sub) -> None:
    p = sub.add_parser("verify", help="replay a saved request and check its token ids bit for bit")
    p.add_argument("request", help="the request body that was sent (JSON)")
    p.add_argument("response", help="the server's response to it (JSON, with token_ids)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the server to replay against, e.g. http://127.0.0.1:8080")
    where.add_argument(
        "--local",
        nargs="?",
        const="",
        metavar="CHECKPOINT",
        help="serve CHECKPOINT (default: the demo model) in this process and replay there",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float64"])
    p.add_argument("--context", default="65536", help="--local: the served context")
    p.add_argument("--api-key", default=None)
    p.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    from .receipts.verify import load, verify

    try:
        request, saved = load(args.request), load(args.response)
    except (OSError, ValueError) as exc:
        print(f"tensorfold verify: {exc}", file=sys.stderr)
        return 2
    if args.url is not None:
        verdict = verify(request, saved, _http_post(args.url, args.api_key))
    else:
        verdict = _verify_local(args, request, saved)
    for line in verdict.lines:
        print(line)
    print("verify: PASS" if verdict.ok else "verify: FAIL")
    return 0 if verdict.ok else 1


def _http_post(url: str, api_key: str | None):
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def post(path: str, body: dict) -> tuple[int, dict]:
        r = httpx.post(url.rstrip("/") + path, json=body, headers=headers, timeout=600)
        return r.status_code, r.json()

    return post


def _verify_local(args: argparse.Namespace, request: dict, saved: dict):
    """The same server code, in this process: the checkpoint loaded, requests through ASGI."""
    from fastapi.testclient import TestClient

    from .receipts.verify import verify
    from .server.cli import _build

    argv = ["serve", *([args.local] if args.local else []), "--device", args.device]
    argv += ["--dtype", args.dtype, "--context", args.context, "--parallel", "1"]
    serve_args = build_parser().parse_args([*argv, "--prompt-cache-gib", "0", "--no-web"])
    app, name = _build(serve_args)
    with TestClient(app) as client:

        def post(path: str, body: dict) -> tuple[int, dict]:
            r = client.post(path, json=body)
            return r.status_code, r.json()

        return verify(request, saved, post, model=name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorfold", description="Exact inference for Qwen3.5 models"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    _verify_parser(sub)
    for module in ("server.cli", "tools.make_random", "receipts.cli"):
        __import__(f"{__package__}.{module}", fromlist=["add_parser"]).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TensorFoldError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
