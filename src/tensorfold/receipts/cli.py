"""`tensorfold bench ...` and `tensorfold check ...`: the receipts (docs/RECEIPTS.md).

Exit codes: 0 every check passed, 1 a check failed, 2 the tool could not run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v)


def _guarded(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A server that cannot be reached or a tokenizer that is missing: exit 2 with one line."""

    def call(args: argparse.Namespace) -> int:
        import httpx

        try:
            return run(args)
        except (httpx.HTTPError, RuntimeError, ValueError, OSError) as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2

    return call


def _server_args(p: argparse.ArgumentParser, model: bool = True) -> None:
    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8080")
    if model:
        p.add_argument("model", help="the model name the server answers to")
    else:
        p.add_argument(
            "--model", default=None, help="model name (default: the first in /v1/models)"
        )
    p.add_argument(
        "--api-key",
        default=os.environ.get("TENSORFOLD_API_KEY") or os.environ.get("OPENAI_API_KEY"),
    )
    p.add_argument("--output", default=None, help="write every record to this JSON file")


def _style_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-token-ids",
        action="store_true",
        help="don't send return_token_ids (hashes then cover the text)",
    )
    p.add_argument("--no-ignore-eos", action="store_true", help="don't send ignore_eos")


def _tokenizer_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer",
        default=None,
        help="checkpoint folder whose tokenizer to use when the server has no /tokenize",
    )


def _plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw the results as a chart")
    p.add_argument("--label", default="this server", help="our series' name in the chart")
    p.add_argument(
        "--peer",
        default=None,
        metavar="PEER.json",
        help="the same tool's --output from another server, drawn beside ours",
    )
    p.add_argument("--peer-label", default="peer", help="the peer's name in the chart")
    p.add_argument(
        "--limit",
        type=float,
        default=None,
        help="the card's limit in tok/s (decode: per lane), drawn as a dashed line",
    )


def _plot(args: argparse.Namespace, key: str):
    """The chart request, checked before the run (matplotlib present, the peer file readable)."""
    if not args.plot:
        return None
    from .plot import PlotRequest, require_matplotlib

    require_matplotlib()
    return PlotRequest.of(args.plot, args.label, args.peer, args.peer_label, args.limit, key)


def _endpoint(args: argparse.Namespace):
    from .client import Endpoint

    return Endpoint.of(args.url, args.api_key)


def _style(args: argparse.Namespace):
    from .prompts import RequestStyle

    return RequestStyle(token_ids=not args.no_token_ids, ignore_eos=not args.no_ignore_eos)


def _bench_config(args: argparse.Namespace):
    from .bench import BenchConfig
    from .prompts import DECODE_PROMPTS, pick

    return BenchConfig(
        _endpoint(args),
        args.model,
        pick(DECODE_PROMPTS, args.prompts),
        args.tokens,
        args.reps,
        _floats(args.temperatures),
        args.seed,
        _style(args),
    )


def _bench_common(p: argparse.ArgumentParser) -> None:
    _server_args(p)
    _style_args(p)
    p.add_argument("--tokens", type=int, default=256, help="tokens generated per request")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--temperatures", default="0", help="comma list; 0 is greedy")
    p.add_argument("--seed", type=int, default=0, help="base seed of sampled requests")
    p.add_argument("--prompts", default=None, help="comma list of code,chat (default both)")
    _plot_args(p)


def _decode(args: argparse.Namespace) -> int:
    import dataclasses

    from .bench import decode_command

    cfg = _bench_config(args)
    if args.context:  # decode at depth: one completion prompt of exactly N tokens
        from .client import Tokens
        from .prefill import context_prompt

        tokens = Tokens(cfg.endpoint, cfg.model, args.tokenizer)
        cfg = dataclasses.replace(
            cfg, prompts=(context_prompt(tokens, args.context, args.as_text),)
        )
    return decode_command(cfg, args.output, _plot(args, "records"))


def _concurrent(args: argparse.Namespace) -> int:
    from .bench import concurrent_command

    return concurrent_command(
        _bench_config(args),
        _ints(args.levels),
        args.alone,
        args.serial,
        args.output,
        _plot(args, "runs"),
    )


def _prefill(args: argparse.Namespace) -> int:
    from .client import Tokens
    from .prefill import PrefillConfig, prefill_command

    endpoint = _endpoint(args)
    model = args.model or endpoint.first_model()
    cfg = PrefillConfig(endpoint, model, _ints(args.sizes), args.rounds, args.warmup, args.as_text)
    return prefill_command(
        cfg, Tokens(endpoint, model, args.tokenizer), args.output, _plot(args, "records")
    )


def _serve(args: argparse.Namespace) -> int:
    from .client import Tokens
    from .serve import ServeConfig, serve_command

    cfg = ServeConfig(
        _endpoint(args),
        args.model,
        _ints(args.concurrency),
        args.input_len,
        args.output_len,
        args.num_prompts,
        args.request_rate,
        args.dataset,
        args.seed,
        args.temperature,
    )
    plot = _plot(args, "runs")
    return serve_command(cfg, Tokens(cfg.endpoint, cfg.model, args.tokenizer), args.output, plot)


def _serve_parser(tools) -> None:
    p = tools.add_parser(
        "serve", help="a serving benchmark: throughput and TTFT/TPOT/ITL percentiles by level"
    )
    _server_args(p)
    _tokenizer_arg(p)
    p.add_argument("--concurrency", default="1,16,64", help="requests in flight, comma list")
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=512, help="tokens generated per request")
    p.add_argument(
        "--num-prompts", type=int, default=0, help="requests per level (0: 4 per slot, >= 8)"
    )
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="Poisson arrivals per second (default inf: every request at once)",
    )
    p.add_argument("--dataset", default="random", help="random (token ids) or text")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy; above 0 each prompt is sampled with seed --seed + its index",
    )
    _plot_args(p)
    p.set_defaults(func=_guarded(_serve))


def _bench_parsers(sub) -> None:
    bench = sub.add_parser(
        "bench", help="served speed receipts against any OpenAI-compatible server"
    )
    tools = bench.add_subparsers(dest="bench_command", required=True)
    p = tools.add_parser("decode", help="per-request tok/s of a code and a chat prompt")
    _bench_common(p)
    p.add_argument(
        "--context",
        type=int,
        default=0,
        help="decode after a prompt of exactly N tokens (the paragraph repeated) instead",
    )
    _tokenizer_arg(p)
    p.add_argument("--as-text", action="store_true", help="send the --context prompt as text")
    p.set_defaults(func=_guarded(_decode))
    p = tools.add_parser(
        "concurrent",
        help="aggregate tok/s by level; token hashes alone, concurrent and draft: false",
    )
    _bench_common(p)
    p.add_argument("--levels", default="1,4", help="concurrent requests, comma list")
    p.add_argument("--alone", action="store_true", help="compare every request with it alone")
    p.add_argument(
        "--serial",
        action="store_true",
        help='compare every request with it alone and "draft": false',
    )
    p.set_defaults(func=_guarded(_concurrent))
    p = tools.add_parser("prefill", help="cold prefill of exact token arrays, wall-clock medians")
    _server_args(p, model=False)
    _tokenizer_arg(p)
    p.add_argument("--sizes", default="2048,8192,32768,65536")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2048, help="tokens of the one warm-up request")
    p.add_argument(
        "--as-text",
        action="store_true",
        help="send the arrays decoded as text (for servers that take no token ids)",
    )
    _plot_args(p)
    p.set_defaults(func=_guarded(_prefill))
    _serve_parser(tools)


def _cancel(args: argparse.Namespace) -> int:
    from .cancel import CancelConfig, cancel_command
    from .client import Tokens

    endpoint = _endpoint(args)
    cfg = CancelConfig(
        endpoint,
        args.model,
        args.probe_tokens,
        args.long_prompt,
        args.drop_after,
        args.window,
        _style(args),
    )
    return cancel_command(cfg, Tokens(endpoint, args.model, args.tokenizer), args.output)


def _known(args: argparse.Namespace) -> int:
    from .known_answers import MODES, KnownConfig, known_command

    cfg = KnownConfig(_endpoint(args), args.model, MODES[args.thinking], args.max_tokens)
    return known_command(cfg, args.output)


def _fidelity(args: argparse.Namespace) -> int:
    from ..util import resolve_device, resolve_dtype
    from .fidelity import FidelityConfig, fidelity_command

    device = resolve_device(args.device)
    cfg = FidelityConfig(
        Path(args.checkpoint),
        Path(args.history),
        resolve_dtype(args.dtype, device),
        device,
        args.float64,
        resolve_device(args.arbiter_device),
    )
    return fidelity_command(cfg, args.output)


def _precision(args: argparse.Namespace) -> int:
    from ..util import resolve_device, resolve_dtype
    from .attention_precision import PrecisionConfig, precision_command

    device = resolve_device(args.device)
    cfg = PrecisionConfig(
        args.heads,
        args.kv_heads,
        args.head_dim,
        args.length,
        _ints(args.rows),
        args.samples,
        _floats(args.queries),
        args.prompt,
        device,
        resolve_dtype(args.dtype, device),
        args.seed,
        args.max_err,
    )
    return precision_command(cfg, args.output)


def _served_checks(tools) -> None:
    p = tools.add_parser(
        "cancel", help="dropped streams and a refused request leave the probes unchanged"
    )
    _server_args(p)
    _style_args(p)
    _tokenizer_arg(p)
    p.add_argument("--probe-tokens", type=int, default=128)
    p.add_argument(
        "--long-prompt",
        type=int,
        default=22000,
        help="tokens of the prompt dropped mid-prompt (capped below the window)",
    )
    p.add_argument("--drop-after", type=int, default=8, help="tokens read before a drop")
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="context limit (default: max_model_len from /v1/models)",
    )
    p.set_defaults(func=_guarded(_cancel))
    p = tools.add_parser("known-answers", help="the demo model's fixed prompts and answers")
    _server_args(p)
    p.add_argument("--thinking", default="off", choices=["off", "on", "both"])
    p.add_argument("--max-tokens", type=int, default=256)
    p.set_defaults(func=_guarded(_known))


def _offline_checks(tools) -> None:
    p = tools.add_parser("fidelity", help="teacher-forced judge against a reference history")
    p.add_argument("checkpoint")
    p.add_argument("--history", required=True, help="JSON from scripts/reference_history.py")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float64"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--float64", action="store_true", help="replay in float64 as the arbiter")
    p.add_argument("--arbiter-device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--output", default=None)
    p.set_defaults(func=_guarded(_fidelity))
    p = tools.add_parser("attention-precision", help="attention kernel against float64")
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument(
        "--prompt", action="store_true", help="16-row prompt tiles instead of decode rows"
    )
    p.add_argument("--length", type=int, default=16384, help="positions in the cache")
    p.add_argument("--rows", default="8192", help="row-range boundaries, comma list")
    p.add_argument("--samples", type=int, default=64, help="query rows measured per range")
    p.add_argument("--queries", default="1,4", help="query value ranges [-r, r), comma list")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float32"],
        help="what the kernel is given (auto: bfloat16 on cuda, float32 on cpu)",
    )
    p.add_argument("--max-err", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None)
    p.set_defaults(func=_guarded(_precision))


def add_parser(sub) -> None:
    _bench_parsers(sub)
    check = sub.add_parser("check", help="correctness receipts: served, fidelity, attention")
    tools = check.add_subparsers(dest="check_command", required=True)
    _served_checks(tools)
    _offline_checks(tools)
