"""Test assets: a byte-level tokenizer for the tiny Llama (id i = byte i)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from dataplane.assets.byte_tokenizer import bytes_to_unicode

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def write_byte_tokenizer(model_dir: Path) -> None:
    """tokenizer.json (BPE, no merges, byte-level) + tokenizer_config.json (chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": table[2], "bos_token": table[1], "chat_template": CHAT_TEMPLATE}))


class GreedyReference:
    """HF transformers + PEFT greedy decoding, EOS not suppressed (the agent's requests
    use `ignore_eos`, so both sides generate exactly `n` tokens, EOS included)."""

    def __init__(self, model_dir: Path, adapters: dict[str, Path]) -> None:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        model: Any = None
        for name, path in adapters.items():
            if model is None:
                model = PeftModel.from_pretrained(base, path, adapter_name=name).eval()
            else:
                model.load_adapter(path, adapter_name=name)
        self.model = model
        self._cache: dict[tuple[tuple[int, ...], int, str | None], list[int]] = {}
        self._lock = threading.Lock()
        """One model switched between adapters (`set_adapter`): calls from several
        threads take turns, or one thread's switch would land in another's forward."""

    def greedy(self, prompt: list[int], n: int, adapter: str | None) -> list[int]:
        key = (tuple(prompt), n, adapter)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = self._run(prompt, n, adapter)
            return self._cache[key]

    def log_softmax(self, prompt: list[int], tokens: list[int], adapter: str | None) -> Any:
        """Float32 log-softmax [len(tokens), vocab] of the distributions `tokens` were drawn
        from (after `prompt` and the tokens before each), under `adapter` (None: base)."""
        import contextlib

        import torch

        ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        with self._lock:
            if adapter is None:
                ctx = self.model.disable_adapter()
            else:
                self.model.set_adapter(adapter)
            with torch.no_grad(), ctx:
                logits = self.model(torch.tensor([[*prompt, *tokens]])).logits[0].float()
        return logits.log_softmax(-1)[len(prompt) - 1:len(prompt) - 1 + len(tokens)]

    def _run(self, prompt: list[int], n: int, adapter: str | None) -> list[int]:
        import contextlib

        import torch

        ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if adapter is None:
            ctx = self.model.disable_adapter()
        else:
            self.model.set_adapter(adapter)
        ids = list(prompt)
        with torch.no_grad(), ctx:
            for _ in range(n):
                logits = self.model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(torch.argmax(logits)))
        return ids[len(prompt):]
