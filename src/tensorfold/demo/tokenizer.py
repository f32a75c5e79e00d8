"""A Qwen3.5-style tokenizer trained from a corpus: byte-level BPE, control tokens, chat template.

The files are written the way Qwen checkpoints ship them (tokenizer.json, tokenizer_config.json,
chat_template.jinja), so transformers' AutoTokenizer and mlx_lm load them offline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

# Same split regex as transformers' Qwen3_5Tokenizer, so every loading path (tokenizer.json as
# is, or transformers rebuilding the backend from vocab/merges for model_type qwen3_5) agrees.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (content, special) in vocabulary order, mirroring the relative order of the real Qwen3.5
# vocabulary. As in Qwen's tokenizer.json the ChatML/vision tokens are "special" (dropped by
# skip_special_tokens) while the tool/think markers are atomic added tokens with special=False,
# so decoded text keeps them for reasoning / tool-call parsing.
CONTROL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _new_tokenizer() -> Tokenizer:
    tok = Tokenizer(
        models.BPE(
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _without_controls(texts: Iterable[str]) -> Iterator[str]:
    # Control tokens are added whole after training: keep their text out of the merges.
    pattern = re.compile("|".join(re.escape(c) for c, _ in CONTROL_TOKENS))
    for text in texts:
        yield from (piece for piece in pattern.split(text) if piece)


def train_tokenizer(
    corpus: Iterable[str], bpe_vocab_size: int, min_frequency: int = 2
) -> Tokenizer:
    """Train the BPE part (256 byte symbols + merges, at most bpe_vocab_size), then append the
    control tokens right after it, as Qwen's own tokenizer.json orders them."""
    tok = _new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size,
        min_frequency=min_frequency,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_without_controls(corpus), trainer=trainer)
    for content, special in CONTROL_TOKENS:
        added = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
    return tok


def tokenizer_config(tok: Tokenizer) -> dict:
    decoder = {
        str(tok.token_to_id(c)): {
            "content": c,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for c, special in CONTROL_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        # transformers 5 loads tokenizer.json verbatim for this class; for a checkpoint dir
        # with model_type qwen3_5 it substitutes Qwen3_5Tokenizer, whose pipeline is the same.
        "tokenizer_class": "TokenizersBackend",
        "unk_token": None,
    }


CHAT_TEMPLATE = r"""{%- set enable_thinking = enable_thinking if enable_thinking is defined else true -%}
{%- macro render_content(content) -%}
    {%- if content is string -%}{{- content -}}
    {%- elif content is none -%}{{- '' -}}
    {%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}
    {%- elif part.type in ['image', 'image_url'] -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
    {%- endif -%}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_message = render_content(messages[0].content) -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set system_message = none -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if system_message is not none -%}{{- system_message + '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\nYou have access to the following functions:\n\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nIf you choose to call a function ONLY reply in the following format:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call><|im_end|>\n' -}}
{%- elif system_message is not none -%}
    {{- '<|im_start|>system\n' + system_message + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query=-1) -%}
{%- for m in loop_messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in loop_messages -%}
    {%- if m.role == 'user' -%}
        {{- '<|im_start|>user\n' + render_content(m.content) + '<|im_end|>\n' -}}
    {%- elif m.role == 'assistant' -%}
        {%- set content = render_content(m.content) -%}
        {%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
        {{- '<|im_start|>assistant\n' -}}
        {#- Past turns re-render exactly as they were generated, think block kept, so the next
            turn's prompt extends the last one token for token and resumes from the prompt cache. -#}
        {%- if reasoning -%}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}
        {%- elif '</think>' in content -%}
            {{- '<think>\n' -}}
        {%- else -%}
            {{- '<think>\n\n</think>\n\n' -}}
        {%- endif -%}
        {{- content -}}
        {%- for tc in (m.tool_calls or []) -%}
            {%- set f = tc.function if tc.function is defined else tc -%}
            {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n<function=' + f.name + '>\n' -}}
            {%- if f.arguments is mapping -%}
                {%- for name, value in f.arguments.items() -%}
                    {{- '<parameter=' + name + '>\n' -}}
                    {{- value if value is string else (value | tojson) -}}
                    {{- '\n</parameter>\n' -}}
                {%- endfor -%}
            {%- elif f.arguments -%}{{- f.arguments + '\n' -}}
            {%- endif -%}
            {{- '</function>\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or loop_messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + render_content(m.content) + '\n</tool_response>' -}}
        {%- if loop.last or loop_messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking -%}{{- '<think>\n' -}}{%- else -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""


def save_tokenizer(tok: Tokenizer, out_dir: str | Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), indent=2) + "\n")
    # transformers 5 reads chat_template.jinja next to tokenizer_config.json (as Qwen ships it).
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return out


def control_token_ids(tok: Tokenizer) -> dict[str, int]:
    return {c: tok.token_to_id(c) for c, _ in CONTROL_TOKENS}
