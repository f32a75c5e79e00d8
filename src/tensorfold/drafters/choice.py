"""Which drafter serves, chosen and refused by name before any weight is read: the `--draft`
flags, `--draft auto`, and a split's refusal."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidRequest, NotStockDrafter, SplitRefused
from ..models.mtp import check_mtp_head
from .lookup import check_drafter_path

MAX_DRAFT_TOKENS = 32


@dataclass(frozen=True)
class DraftConfig:
    """What the engine drafts with: `method` is None (off), "ngram", "mtp" or a drafter path."""

    method: str | None = None
    tokens: int = 4  # draft tokens per verify pass (k)

    def __post_init__(self) -> None:
        if not 1 <= self.tokens <= MAX_DRAFT_TOKENS:
            raise InvalidRequest(
                f"draft_tokens={self.tokens} must be between 1 and {MAX_DRAFT_TOKENS}",
                param="draft_tokens",
            )


def add_flags(p) -> None:
    """--draft and --draft-tokens of `serve` and `run`."""
    p.add_argument(
        "--draft",
        default=None,
        help="draft with: ngram (prompt lookup), mtp (the checkpoint's MTP head), auto (mtp when "
        "the checkpoint has a head, else off) or a drafter folder; output is the same as "
        "without (default: off)",
    )
    p.add_argument("--draft-tokens", type=int, default=4, help="tokens drafted per verify pass")


def refuse_split_draft() -> str:
    return (
        "drafting (--draft) is not served with a tensor split yet: the other ranks do not keep "
        "the lanes' spare state slots; serve with --tensor-parallel 1, or without --draft"
    )


def resolve_auto(
    method: str | None, checkpoint, ranks: int = 1, device: str = "cpu", graphs: bool = True
) -> tuple[str | None, str]:
    """`--draft auto`: "mtp" when the checkpoint has a head it can serve, else no drafting; with
    the line that says which (empty for any other method, returned as it is). A head bound to
    another target is still refused (DraftForAnotherTarget): it is a broken file, not a missing
    one. On a GPU without CUDA graphs it does not draft: the head's steps and the passes would
    run eager, and for a small target that loses (docs/BENCHMARKS.md)."""
    if method != "auto":
        return method, ""
    if ranks > 1:
        return None, "--draft auto: no drafting with a tensor split"
    try:
        check_mtp_head(checkpoint)
    except NotStockDrafter as exc:
        return None, f"--draft auto: serving without drafting ({exc})"
    if str(device).startswith("cuda") and not graphs:
        return None, (
            "--draft auto: serving without drafting on a GPU without CUDA graphs, where the "
            "MTP head's steps run eager (pass --draft mtp to draft with it)"
        )
    return "mtp", f"--draft auto: drafting with the MTP head of {checkpoint}"


def check(method: str | None, tokens: int, checkpoint=None, ranks: int = 1) -> DraftConfig:
    """The drafting asked for, refused by name before any weight is read: an MTP head is bound
    to the checkpoint by its tensors' names and shapes (headers only); none with a split."""
    if method is not None and ranks > 1:
        raise SplitRefused(refuse_split_draft())
    config = DraftConfig(method, tokens)
    if method == "mtp":
        if checkpoint is not None:
            check_mtp_head(checkpoint)
    elif method is not None and method != "ngram":
        check_drafter_path(method, checkpoint)
    return config
