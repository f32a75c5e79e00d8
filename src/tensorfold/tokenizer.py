"""The checkpoint's own tokenizer and chat template, through transformers (offline)."""

from __future__ import annotations

from pathlib import Path

from .checkpoint_info import generation_config
from .errors import ConfigError


class Tokenizer:
    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        self.path = Path(path)
        self.hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.eos_ids = self._eos_ids()
        # A reply decodes twice a token: the Rust backend directly is ~3x cheaper than the
        # wrapper's checks, and gives the same text when the wrapper cleans up nothing.
        backend = getattr(self.hf, "_tokenizer", None)
        clean = getattr(self.hf, "clean_up_tokenization_spaces", True)
        self._backend = backend if backend is not None and not clean else None

    @staticmethod
    def exists(path: str | Path) -> bool:
        p = Path(path)
        return (p / "tokenizer.json").is_file() or (p / "tokenizer_config.json").is_file()

    def _eos_ids(self) -> tuple[int, ...]:
        ids = [self.hf.eos_token_id] if self.hf.eos_token_id is not None else []
        eos = generation_config(self.path).get("eos_token_id")
        ids += [eos] if isinstance(eos, int) else list(eos or [])
        return tuple(dict.fromkeys(ids))

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def chat(
        self, messages: list[dict], *, add_generation_prompt: bool = True, **template_kwargs
    ) -> list[int]:
        """Renders messages with the checkpoint's chat template (e.g. enable_thinking=False)."""
        if not getattr(self.hf, "chat_template", None):
            raise ConfigError(f"{self.path}: the tokenizer has no chat_template")
        text = self.hf.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, **template_kwargs
        )
        return self.encode(text)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)

    def __len__(self) -> int:
        return len(self.hf)
