"""TensorFold: exact inference for the Qwen3.5 hybrid models."""

from .engine.request import SamplingParams
from .llm import LLM, CompletionOutput, RequestOutput

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
