"""Offline batches in vLLM's shape: LLM(path).generate(prompts, SamplingParams(...)).

It drives the same engine as the server, so offline and served tokens are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .drafters.choice import check as check_draft
from .engine.engine import Engine, EngineConfig
from .engine.request import SamplingParams
from .errors import QueueFull
from .runner.launch import load_split
from .tokenizer import Tokenizer
from .util import resolve_device, resolve_dtype


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


class LLM:
    def __init__(
        self,
        model: str | Path,
        *,
        dtype: str | torch.dtype = "auto",
        device: str = "auto",
        parallel: int = 4,
        context: int = 4096,
        chunk: int = 128,
        tensor_parallel: int = 1,
        **engine_kwargs,
    ) -> None:
        """`tensor_parallel=N` splits the model over N ranks on this machine (exact: the same
        tokens as whole); this process is rank 0, and `close()` lets the others go."""
        dev = resolve_device(device)
        if engine_kwargs.get("draft"):  # a drafter that cannot serve is refused before loading
            check_draft(
                engine_kwargs["draft"], engine_kwargs.get("draft_tokens", 4), model, tensor_parallel
            )
        self.model, _ = load_split(model, resolve_dtype(dtype, dev), dev, tensor_parallel)
        self.tokenizer = Tokenizer(model) if Tokenizer.exists(model) else None
        config = EngineConfig(parallel=parallel, context=context, chunk=chunk, **engine_kwargs)
        self.engine = Engine(self.model, self.tokenizer, config)

    def close(self) -> None:
        """Stops the other ranks of a split (a no-op when whole); the LLM is unusable after."""
        self.engine.close()

    def _ids(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: pass token ids")
            return prompt, self.tokenizer.encode(prompt)
        return None, [int(t) for t in prompt]

    def generate(
        self,
        prompts,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        n: int = 1,
    ) -> list[RequestOutput]:
        """All prompts go in together and share passes, `parallel` lanes at a time."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        pending = []
        for prompt, p in zip(prompts, params_list):
            text, ids = self._ids(prompt)
            reqs = [self._submit(ids, p, i) for i in range(n)]
            pending.append((text, ids, reqs))
        self.engine.run_until_done()
        return [
            RequestOutput(
                reqs[0].request_id,
                text,
                ids,
                [
                    CompletionOutput(i, r.text, list(r.output_ids), r.finish_reason)
                    for i, r in enumerate(reqs)
                ],
            )
            for text, ids, reqs in pending
        ]

    def _submit(self, ids: list[int], params: SamplingParams, choice: int):
        """Adds a request, stepping the engine while its queue is full."""
        while True:
            try:
                return self.engine.add_request(ids, params, choice=choice)
            except QueueFull:
                self.engine.step()

    def chat(
        self, messages: list[dict], sampling_params: SamplingParams | None = None, **template_kwargs
    ) -> RequestOutput:
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer")
        ids = self.tokenizer.chat(messages, **template_kwargs)
        return self.generate([ids], sampling_params)[0]
