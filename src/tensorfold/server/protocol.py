"""OpenAI request and response schemas (pydantic), plus the vLLM-style extensions we honour."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from .limits import MAX_TEMPERATURE

# A list stops at its first bad item: a 2 MB list of bad items must not cost a million errors.
FAIL_FAST = Field(fail_fast=True)
TokenIds = Annotated[list[StrictInt], FAIL_FAST]
Prompt = str | TokenIds | Annotated[list[str], FAIL_FAST] | Annotated[list[TokenIds], FAIL_FAST]
# JSON's numbers only (Python's parser also takes Infinity and NaN); a bool is never "yes".
Finite = Annotated[float, Field(allow_inf_nan=False)]
Temperature = Annotated[float, Field(allow_inf_nan=False, le=MAX_TEMPERATURE)]
Seed = Annotated[StrictInt, Field(ge=-(1 << 63), le=(1 << 63) - 1)]  # int64, as vLLM

# Other servers' fields that would change the output and are not implemented: refused by name
# when set (to anything but null or false), never accepted and ignored.
REFUSED = (
    "structured_outputs",  # vLLM's; response_format covers JSON
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",  # llama.cpp's
    "json_schema",  # llama.cpp's top-level one
    "use_beam_search",
    "truncate_prompt_tokens",
    "bad_words",
    "allowed_token_ids",
)
# Fields that are bookkeeping only: accepted and ignored (they never change tokens).
IGNORED = (
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
)


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class Prediction(BaseModel):
    """OpenAI Predicted Outputs: text the reply is expected to repeat, drafted from."""

    type: Literal["content"]
    content: str | Annotated[list[ContentPart], FAIL_FAST]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class GenerationRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions; unknown fields are logged."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: StrictInt | None = None
    temperature: Temperature | None = None
    top_p: Finite | None = None
    top_k: StrictInt | None = None
    min_p: Finite | None = None
    seed: Seed | None = None
    stop: str | Annotated[list[str], FAIL_FAST] | None = None  # sizes: serving.check_stops
    stop_token_ids: TokenIds | None = None
    ignore_eos: StrictBool = False
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    draft: StrictBool | None = None  # false: served without drafting (the tokens are the same)
    prediction: Prediction | None = None  # OpenAI Predicted Outputs
    return_token_ids: StrictBool = False  # adds token_ids to each choice (and chunk)
    presence_penalty: Finite | None = None
    frequency_penalty: Finite | None = None
    repetition_penalty: Finite | None = None
    logit_bias: dict[str, Finite] | None = None  # token id (as a string) -> bias
    min_tokens: StrictInt = 0
    prompt_logprobs: StrictInt | None = None  # vLLM's: the prompt tokens' logprobs
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: StrictBool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats

    def unsupported(self) -> str | None:
        """The first field set to something we cannot honour, or None."""
        extra = self.model_extra or {}
        return next((k for k in REFUSED if extra.get(k) not in (None, False)), None)


class CompletionRequest(GenerationRequest):
    prompt: Prompt
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None

    def unsupported(self) -> str | None:
        if self.suffix:
            return "suffix"
        if self.best_of not in (None, 1, self.n):
            return "best_of"
        return super().unsupported()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | Annotated[list[ContentPart], FAIL_FAST] | None = None


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[ChatMessage], FAIL_FAST]
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # only with --trust-request-chat-template
    add_generation_prompt: StrictBool = True
    tools: Annotated[list[dict[str, Any]], FAIL_FAST] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    include_reasoning: StrictBool = True  # vLLM's: False leaves the trace out of the reply

    def unsupported(self) -> str | None:
        extra = self.model_extra or {}
        for name in ("echo", "continue_final_message"):  # vLLM's chat extensions
            if extra.get(name) not in (None, False):
                return name
        return super().unsupported()


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], FAIL_FAST] | None = None
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    tools: Annotated[list[dict[str, Any]], FAIL_FAST] | None = None  # rendered as chat renders them
    return_token_strs: StrictBool = False  # vLLM's: each token's text beside its id
    continue_final_message: StrictBool = False  # refused, as chat refuses it (never ignored)


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: TokenIds


# -- responses ---------------------------------------------------------------------------------


def _unix() -> int:
    return int(time.time())


def _omit_none(value: Any) -> bool:
    return value is None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    # Present when the request carried a prediction.
    completion_tokens_details: CompletionTokensDetails | None = Field(
        default=None, exclude_if=_omit_none
    )


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)  # None: an echoed first
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_omit_none)
    prompt_logprobs: list[dict[str, Any] | None] | None = Field(default=None, exclude_if=_omit_none)
    # vLLM's return_token_ids: the prompt's ids on the choice (a stream: its first chunk)
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_omit_none)


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_unix)
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] = Field(default_factory=list)


class FunctionCall(BaseModel):
    name: str | None = Field(default=None, exclude_if=_omit_none)
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = Field(default=None, exclude_if=_omit_none)
    type: Literal["function"] | None = Field(default=None, exclude_if=_omit_none)
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    # the thinking trace under both names clients read (vLLM's older one and the newer one)
    reasoning_content: str | None = Field(default=None, exclude_if=_omit_none)
    reasoning: str | None = Field(default=None, exclude_if=_omit_none)
    tool_calls: list[ToolCallOut] | None = Field(default=None, exclude_if=_omit_none)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_omit_none)


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_unix)
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = Field(default=None, exclude_if=_omit_none)
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_omit_none)  # vLLM's place


class Delta(BaseModel):
    role: Literal["assistant"] | None = Field(default=None, exclude_if=_omit_none)
    content: str | None = Field(default=None, exclude_if=_omit_none)
    reasoning_content: str | None = Field(default=None, exclude_if=_omit_none)
    reasoning: str | None = Field(default=None, exclude_if=_omit_none)
    tool_calls: list[ToolCallDelta] | None = Field(default=None, exclude_if=_omit_none)


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=_omit_none)


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_unix)
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: Usage | None = Field(default=None, exclude_if=_omit_none)
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=_omit_none)  # first chunk


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_unix)
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = Field(default=None, exclude_if=_omit_none)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_unix)
    owned_by: str = "tensorfold"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
