"""`tensorfold serve`: load a checkpoint, start the engine thread, serve the OpenAI API."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from pathlib import Path

from ..drafters.choice import add_flags as add_draft_flags
from ..engine.flags import add_model_flags, add_overlap_flag, chunk_for, mixed_chunk_for
from .limits import add_flags as add_limit_flags

log = logging.getLogger("tensorfold.server")
MIB = 1 << 20
SHUTDOWN_BACKSTOP_S = 5.0  # after the grace: how long cancelled streams get to end
DEFAULT_MAX_TOKENS = 8192  # a reply that sets no limit ends here, not at --context (a runaway)


def reply_limit(flag: int | None, defaults) -> int:
    """The reply limit of requests that set none: the flag, else the checkpoint's
    generation_config max_new_tokens (`defaults`: its SamplingDefaults), else DEFAULT_MAX_TOKENS
    (0: the rest of the context)."""
    if flag is not None:
        return flag
    return defaults.max_new_tokens or DEFAULT_MAX_TOKENS


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    add_model_flags(p, 65536, "prompt + generation limit per request")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on a GPU, replay decode and verify passes as CUDA graphs (same kernels and bits, one launch "
        "per pass)",
    )
    add_overlap_flag(p)
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429")
    p.add_argument(
        "--mixed-chunk",
        type=int,
        default=None,
        help="prompt rows a pass takes in all while other lanes decode, so their next tokens "
        "wait for a short pass (default: no cap, whole --chunk passes; 256 halves the 9B's "
        "worst gap between tokens at some cost in throughput); on a GPU a piece beside "
        "decoding lanes replays a CUDA graph",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="reply limit of a request that sets none (default: the checkpoint's "
        f"generation_config max_new_tokens, else {DEFAULT_MAX_TOKENS}; 0: the rest of --context)",
    )
    p.add_argument(
        "--prompt-cache-gib",
        type=float,
        default=1.0,
        help="memory for the prompt cache, on top of the lanes' (0 turns it off)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients send (default: the checkpoint folder's name)",
    )
    add_limit_flags(p)
    add_draft_flags(p)
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        help="seconds running requests get to finish on SIGINT/SIGTERM before cancel",
    )
    p.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated origins browsers may call the API from (CORS; '*' for any); "
        "default none",
    )
    p.add_argument(
        "--web",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the chat page at GET / (--no-web: the API alone)",
    )
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="choose and compile the GPU launch shapes before reporting healthy",
    )
    p.add_argument(
        "--warmup-seconds", type=float, default=300.0, help="bound on the warm-up's time"
    )
    p.add_argument(
        "--tile-cache",
        default=None,
        metavar="DIR",
        help="folder of the launch-shape choices kept across starts "
        "(default $XDG_CACHE_HOME/tensorfold or ~/.cache/tensorfold; 'off' turns it off)",
    )
    p.set_defaults(func=serve)


DEMO_NAME = "tensorfold-demo"


def served_name(path: Path) -> str:
    """The model name a checkpoint is served under: the demo's, named or not, else its folder's."""
    from ..demo import is_demo

    return DEMO_NAME if is_demo(path) else Path(path).name


def _build(args: argparse.Namespace):
    from ..drafters.choice import check as check_draft
    from ..drafters.choice import resolve_auto
    from ..engine.engine import Engine, EngineConfig
    from ..engine.fingerprint import system_fingerprint
    from ..runner.launch import load_split
    from ..tokenizer import Tokenizer
    from ..util import default_checkpoint, resolve_device, resolve_dtype
    from .api import create_app
    from .auth import resolve_api_key
    from .limits import from_args
    from .serving import SamplingDefaults

    try:  # a bad key file, limit or drafter fails before a weight is loaded
        api_key = resolve_api_key(args.api_key, args.api_key_file)
        limits = from_args(args, args.context, args.max_queue)
        path = default_checkpoint(args.checkpoint).resolve()
        device = resolve_device(args.device)
        args.draft, note = resolve_auto(
            args.draft, path, args.tensor_parallel, device.type, args.cuda_graphs
        )
        check_draft(args.draft, args.draft_tokens, path, args.tensor_parallel)
        if args.overlap and args.tensor_parallel > 1:
            raise ValueError(
                "--overlap needs a whole model: serve without --overlap or --tensor-parallel"
            )
        args.chunk = chunk_for(args.chunk, device)
        args.mixed_chunk = mixed_chunk_for(args.mixed_chunk)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"tensorfold serve: {exc}") from None
    if note:
        log.info("%s", note)
    dtype = resolve_dtype(args.dtype, device)
    start = time.monotonic()
    log.info("loading %s on %s (%s)", path, device, str(dtype).removeprefix("torch."))
    # a following rank of a split follows rank 0 inside load_split and exits there at its stop
    model, device = load_split(path, dtype, device, args.tensor_parallel, progress=True)
    tokenizer = Tokenizer(path) if Tokenizer.exists(path) else None
    if args.context > model.config.max_position_embeddings:
        log.warning(
            "--context %d is past the model's max_position_embeddings (%d)",
            args.context,
            model.config.max_position_embeddings,
        )
    defaults = SamplingDefaults.from_checkpoint(path)
    config = EngineConfig(
        parallel=args.parallel,
        context=args.context,
        chunk=args.chunk,
        mixed_chunk=args.mixed_chunk,
        threads=args.threads,
        cuda_graphs=args.cuda_graphs,
        max_queue=args.max_queue,
        max_tokens=reply_limit(args.max_tokens, defaults) or None,
        prompt_cache_bytes=int(args.prompt_cache_gib * (1 << 30)),
        draft=args.draft,
        draft_tokens=args.draft_tokens,
        gdn_form=args.gdn_form,
        overlap=args.overlap,
        unpacked_weights=args.unpacked_weights,
    )
    engine = Engine(model, tokenizer, config)
    memory = engine.memory()
    log.info(
        "loaded in %.1fs: weights %.1f MiB (held unpacked too: %.1f MiB), KV pool %.1f MiB, "
        "state pool %.1f MiB; sampling defaults %s",
        time.monotonic() - start,
        memory.weights_bytes / MIB,
        memory.unpacked_bytes / MIB,
        memory.kv_pool_bytes / MIB,
        memory.state_pool_bytes / MIB,
        defaults,
    )
    if memory.kv_contexts < args.parallel:
        log.warning(
            "the KV pool holds %d whole contexts of %d tokens for %d lanes: they share its pages, "
            "and a request starts once the pages its prompt and max_tokens reach are free",
            memory.kv_contexts,
            args.context,
            args.parallel,
        )
    name = args.served_model_name or served_name(path)
    fingerprint = system_fingerprint(path, dtype, device, gdn_form=args.gdn_form)
    log.info("system_fingerprint %s", fingerprint)
    app = create_app(
        engine,
        tokenizer,
        name,
        api_key=api_key,
        defaults=defaults,
        web=args.web,
        limits=limits,
        warmup=_warmup(engine, args),
        fingerprint=fingerprint,
        allowed_origins=tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip()),
    )
    return app, name


def _warmup(engine, args: argparse.Namespace):
    """The warm-up the engine thread runs before serving (None when turned off)."""
    if not args.warmup:
        return None
    from ..engine.warmup import default_cache_dir, warm_up

    folder = args.tile_cache
    cache = None if folder == "off" else Path(folder) if folder else default_cache_dir()
    return lambda: warm_up(engine, args.warmup_seconds, cache, progress=True)


def _graceful_server(config, bridge, grace: float):
    """A uvicorn server that, `grace` seconds into a shutdown, cancels what is still running,
    so every stream ends with a last chunk (finish_reason "cancelled") and [DONE]."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            timer = asyncio.get_running_loop().call_later(grace, bridge.cancel_all)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return GracefulServer(config)


def serve(args: argparse.Namespace) -> int:
    from .connections import server_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    app, name = _build(args)
    log.info(
        "serving %r: parallel %d, context %d, chunk %d, queue %d",
        name,
        args.parallel,
        args.context,
        args.chunk,
        args.max_queue,
    )
    if args.web:
        log.info("chat page: http://%s:%d/", args.host, args.port)
    config = server_config(
        app,
        args.host,
        args.port,
        access_log=False,
        timeout_graceful_shutdown=args.shutdown_grace + SHUTDOWN_BACKSTOP_S,
    )
    # uvicorn re-raises SIGINT/SIGTERM to the previous handler once it has shut down gracefully;
    # a no-op one there lets a signalled server end like any other: exit code 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _graceful_server(config, app.state.server.engine, args.shutdown_grace).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("stopped")
    return 0
