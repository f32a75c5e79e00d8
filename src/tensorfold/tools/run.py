"""`tensorfold run`: one prompt, offline, through the engine; optionally a seams comparison."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..drafters.choice import check as check_draft
from ..drafters.choice import resolve_auto
from ..engine.engine import Engine, EngineConfig
from ..engine.flags import chunk_for
from ..engine.request import SamplingParams, Watch
from ..runner.launch import load_split
from ..tokenizer import Tokenizer
from ..util import default_checkpoint, resolve_device, resolve_dtype, token_sha


def _prompt_ids(args, tok: Tokenizer | None) -> list[int]:
    if args.tokens is not None:
        src = Path(args.tokens)
        text = (
            src.read_text()
            if not args.tokens.lstrip().startswith("[") and src.is_file()
            else args.tokens
        )
        return [int(t) for t in json.loads(text)]
    if tok is None:
        raise SystemExit("error: this checkpoint has no tokenizer: use --tokens")
    if args.chat is not None:
        kwargs = {"enable_thinking": False} if args.no_thinking else {}
        return tok.chat([{"role": "user", "content": args.chat}], **kwargs)
    return tok.encode(args.prompt)


def _chat_parts(args, tok, ids: list[int], text: str) -> tuple[str | None, str]:
    """(trace, answer) of a --chat reply (the trace None when it has none), else (None, text)."""
    if args.chat is None or tok is None:
        return None, text
    from ..engine.reasoning import split_reasoning, think_ids, thinking_open

    return split_reasoning(text, thinking_open(ids, *think_ids(tok)))


def _params(args) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )


def generate_once(engine: Engine, ids: list[int], params: SamplingParams, seams: int | None = None):
    """Runs one request alone; with `seams`, fingerprints every seams-th prompt row, the prompt
    end and the end of the reply. Returns (request, [(label, position, sha256)])."""
    prints: list[tuple[str, int, str]] = []
    cuts = tuple(range(seams, len(ids), seams)) + (len(ids),) if seams else ()

    def on_cut(req, pos, logits):
        label = "prompt end" if pos == len(ids) else "seam"
        prints.append((label, pos, engine.fingerprint(req, logits)))

    def on_finish(req, logits):
        prints.append(("reply end", req.lane.computed, engine.fingerprint(req, logits)))

    watch = Watch(cuts=cuts, on_cut=on_cut, on_finish=on_finish) if seams else None
    req = engine.add_request(ids, params, watch=watch)
    engine.run_until_done()
    return req, prints


def run_command(args) -> int:
    path = default_checkpoint(args.checkpoint)
    device = resolve_device(args.device)
    args.chunk = chunk_for(args.chunk, device)
    args.draft, note = resolve_auto(args.draft, path, args.tensor_parallel, device.type)
    if note:
        print(note, file=sys.stderr)
    check_draft(args.draft, args.draft_tokens, path, args.tensor_parallel)  # before any read
    dtype = resolve_dtype(args.dtype, device)
    # a following rank of a split follows rank 0 inside load_split and exits there at its stop
    model, device = load_split(path, dtype, device, args.tensor_parallel)
    tok = Tokenizer(path) if Tokenizer.exists(path) else None
    ids = _prompt_ids(args, tok)
    context = args.context or max(4096, len(ids) + args.max_tokens)
    params = _params(args)

    def engine(chunk: int) -> Engine:
        return Engine(
            model,
            tok,
            EngineConfig(
                parallel=args.parallel,
                context=context,
                chunk=chunk,
                threads=args.threads,
                draft=args.draft,
                draft_tokens=args.draft_tokens,
                gdn_form=args.gdn_form,
                unpacked_weights=args.unpacked_weights,
            ),
        )

    seams = args.seams if args.compare_chunk else None
    last = engine(args.chunk)
    req, prints = generate_once(last, ids, params, seams)
    result = {
        "prompt_tokens": len(ids),
        "token_ids": req.output_ids,
        "text": req.text,
        "token_sha": token_sha(req.output_ids),
        "finish_reason": req.finish_reason,
    }
    if req.lane.draft is not None:  # tokens drafted and kept (the reply is the same without)
        result["draft"] = {"proposed": req.lane.draft.proposed, "accepted": req.lane.draft.accepted}
    if args.compare_chunk:
        last = engine(args.compare_chunk)  # a split's ranks now follow this engine
        other, prints_b = generate_once(last, ids, params, seams)
        result["seams"] = _compare(prints, prints_b, args.chunk, args.compare_chunk)
        result["seams_equal"] = (
            all(s["equal"] for s in result["seams"]) and other.output_ids == req.output_ids
        )
    last.close()  # a split's other ranks stop
    trace, answer = _chat_parts(args, tok, ids, req.text)
    if trace is not None:  # a chat reply's trace and answer apart, as the server gives them
        result |= {"reasoning_content": trace, "content": answer}
    if args.json:
        print(json.dumps(result))
    elif trace is not None:
        print(trace.strip(), file=sys.stderr)  # the trace beside, the answer alone on stdout
        print(answer)
    else:
        print(req.text if tok is not None else req.output_ids)
        if args.compare_chunk:
            _print_seams(result, args.chunk, args.compare_chunk)
    return 0 if result.get("seams_equal", True) else 1


def _compare(a, b, chunk_a: int, chunk_b: int) -> list[dict]:
    rows = []
    for (label, pos, fa), (_, pos_b, fb) in zip(a, b):
        rows.append(
            {
                "at": label,
                "position": pos,
                f"chunk_{chunk_a}": fa,
                f"chunk_{chunk_b}": fb,
                "equal": fa == fb and pos == pos_b,
            }
        )
    if len(a) != len(b):
        rows.append({"at": "count", "position": -1, "equal": False})
    return rows


def _print_seams(result: dict, chunk_a: int, chunk_b: int) -> None:
    print(
        f"{'at':<11} {'row':>7}  {'chunk ' + str(chunk_a):<18} {'chunk ' + str(chunk_b):<18} equal",
        file=sys.stderr,
    )
    for s in result["seams"]:
        fa, fb = s.get(f"chunk_{chunk_a}", "-"), s.get(f"chunk_{chunk_b}", "-")
        print(
            f"{s['at']:<11} {s['position']:>7}  {fa[:16]:<18} {fb[:16]:<18} {s['equal']}",
            file=sys.stderr,
        )
    print(f"seams equal: {result['seams_equal']}", file=sys.stderr)
