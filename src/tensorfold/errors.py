"""Named errors. Each one says what was wrong and where, before any weight is read."""

from __future__ import annotations


class TensorFoldError(Exception):
    """Base of every error TensorFold raises on purpose."""


class ConfigError(TensorFoldError, ValueError):
    """config.json describes something we cannot run; the message names the field."""


class UnsupportedModelType(ConfigError):
    pass


class UnsupportedMoE(ConfigError):
    pass


class UnsupportedExperts(UnsupportedMoE):
    """A mixture-of-experts setting the routing and expert products do not serve (an expert count
    or top-k past their limits, routing weights left unnormalised, dense layers among MoE ones)."""


class UnknownLayerType(ConfigError):
    pass


class InconsistentShape(ConfigError):
    pass


class UnsupportedQuantization(ConfigError):
    pass


class NotStockDrafter(ConfigError):
    """A drafter this build cannot serve (a shape, a kind or a file it does not know)."""


class DraftForAnotherTarget(ConfigError):
    """A drafter bound to another target: its width, vocabulary, depth, taps or mask id differ."""


class CacheTooLarge(ConfigError):
    """The caches that --parallel and --context ask for do not fit the device's free memory;
    raised before they are allocated."""


class UnpackedTooLarge(ConfigError):
    """--unpacked-weights would hold more dequantized weights than the device has free;
    raised before any is made."""


class CheckpointError(TensorFoldError):
    """The weight files do not match the config; the message names the tensor."""


class MissingTensor(CheckpointError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class BadTensor(CheckpointError, ValueError):
    pass


class RequestError(TensorFoldError, ValueError):
    """A request that cannot be served as asked; `param` names the offending parameter."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextOverflow(RequestError):
    pass


class InvalidRequest(RequestError):
    pass


class QueueFull(TensorFoldError):
    pass


class SplitRefused(TensorFoldError, ValueError):
    """A tensor split that cannot give the whole model's bits (heads or experts not divisible
    by the ranks, a dtype whose products are not column-invariant, ranks that disagree); raised
    before any weight is read."""


class RankLost(TensorFoldError, RuntimeError):
    """A rank of a tensor split stopped answering (it died, or a collective failed): the split
    cannot continue, and the server answers 503."""


class NonFiniteLogits(TensorFoldError, RuntimeError):
    """A logit row holds NaN or inf: no token can be picked from it honestly."""
