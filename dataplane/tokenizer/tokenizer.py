"""Tokenizer loaded from an HF model directory with the `tokenizers` library only.

Files read: `tokenizer.json` (required); `tokenizer_config.json` (special tokens, chat
template); `chat_template.jinja` or `chat_template.json` (where newer transformers save the
template); `generation_config.json` (eos ids). No transformers import at run time.

EOS policy, matching HF `generate`: `eos_token_ids` are generation_config's `eos_token_id`
(int or list) when present, else the tokenizer config's `eos_token`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from dataplane.core import EngineError
from dataplane.tokenizer.byte_level import ByteLevelDetokenizer, byte_pieces, is_byte_level
from dataplane.tokenizer.chat_template import ChatTemplateError, render_chat_template
from dataplane.tokenizer.detokenizer import IncrementalDetokenizer

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class TokenizerLoadError(EngineError):
    code = "TOKENIZER_LOAD_ERROR"


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path.name} is not a JSON object")
    return data


def _token_str(value: object) -> str | None:
    """A special token as stored in tokenizer_config.json: a str or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _chat_template(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    source = config.get("chat_template")
    if source is None and (model_dir / "chat_template.jinja").is_file():
        source = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if source is None:
        source = _read_json(model_dir / "chat_template.json").get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    return source if isinstance(source, str) else None


class Tokenizer:
    def __init__(self, tokenizer: HFTokenizer, *, special_tokens: Mapping[str, str],
                 eos_token_ids: Sequence[int], chat_template: str | None) -> None:
        self.hf = tokenizer
        self.special_tokens = dict(special_tokens)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.chat_template = chat_template
        self._byte_level = is_byte_level(tokenizer)
        self._pieces: dict[bool, tuple[bytes, ...]] = {}

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerLoadError("tokenizer.json not found", model_dir=str(model_dir))
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as exc:
            raise TokenizerLoadError(f"invalid tokenizer.json: {exc}") from exc
        config = _read_json(model_dir / "tokenizer_config.json")
        special = {k: t for k in SPECIAL_TOKEN_KEYS if (t := _token_str(config.get(k)))}
        gen = _read_json(model_dir / "generation_config.json").get("eos_token_id")
        if gen is not None:
            eos = [gen] if isinstance(gen, int) else list(gen)
        elif "eos_token" in special:
            eos_id = hf.token_to_id(special["eos_token"])
            eos = [] if eos_id is None else [eos_id]
        else:
            eos = []
        if any(not isinstance(e, int) or isinstance(e, bool) for e in eos):
            raise TokenizerLoadError("eos_token_id must be an int or a list of ints", eos=eos)
        return cls(hf, special_tokens=special, eos_token_ids=eos,
                   chat_template=_chat_template(model_dir, config))

    # ----- ids <-> text -----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.hf.get_vocab_size(with_added_tokens=True))

    def token_id(self, name: str) -> int | None:
        """Id of a special token by role ("bos_token", ...), if the model has it."""
        token = self.special_tokens.get(name)
        return None if token is None else self.hf.token_to_id(token)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def detokenizer(self, prompt_ids: Sequence[int], *, skip_special_tokens: bool = True
                    ) -> ByteLevelDetokenizer | IncrementalDetokenizer:
        """A streaming detokenizer for the tokens generated after `prompt_ids`: a byte table
        lookup per token for byte-level tokenizers (tokenizer/byte_level.py), else the
        prefix-offset method (tokenizer/detokenizer.py)."""
        if self._byte_level:
            return ByteLevelDetokenizer(self.byte_pieces(skip_special_tokens))
        hf_decode = self.hf.decode  # called per generated token: no wrapper in between

        def decode(ids: Sequence[int]) -> str:
            return str(hf_decode(ids, skip_special_tokens=skip_special_tokens))

        return IncrementalDetokenizer(decode, prompt_ids)

    def byte_pieces(self, skip_special_tokens: bool = True) -> tuple[bytes, ...]:
        """Each token id's bytes for a byte-level tokenizer, built once per flag (~0.1 s per
        50,000 tokens: the engine builds the table it streams with when it starts)."""
        if not self._byte_level:
            raise TokenizerLoadError("the tokenizer's decoder is not byte-level")
        pieces = self._pieces.get(skip_special_tokens)
        if pieces is None:
            pieces = byte_pieces(self.hf, skip_special_tokens=skip_special_tokens)
            self._pieces[skip_special_tokens] = pieces
        return pieces

    @property
    def is_byte_level(self) -> bool:
        """Whether streaming uses the byte table (the decoder is exactly ByteLevel)."""
        return self._byte_level

    # ----- chat ---------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[Mapping[str, Any]], *,
                            add_generation_prompt: bool = False,
                            tools: list[Mapping[str, Any]] | None = None,
                            chat_template: str | None = None, **kwargs: Any) -> str:
        """Prompt text, as transformers' apply_chat_template(..., tokenize=False)."""
        source = chat_template or self.chat_template
        if source is None:
            raise ChatTemplateError("the model has no chat template")
        return render_chat_template(source, messages, special_tokens=self.special_tokens,
                                    add_generation_prompt=add_generation_prompt, tools=tools,
                                    **kwargs)

    def encode_chat(self, messages: list[Mapping[str, Any]], **kwargs: Any) -> list[int]:
        """Prompt ids of a chat; the template supplies special tokens (none are added)."""
        return self.encode(self.apply_chat_template(messages, **kwargs), add_special_tokens=False)
