"""Tokenizer, chat template and incremental detokenisation vs transformers as the reference."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer

from dataplane.core import FinishReason, SamplingParams, Sequence
from dataplane.sampling import StopChecker
from dataplane.tokenizer import (
    ByteLevelDetokenizer,
    ChatTemplateError,
    IncrementalDetokenizer,
    Tokenizer,
    TokenizerLoadError,
)

TEXTS = [
    "Hello, world! How are you?",
    "  leading spaces and\ttabs\nnew lines",
    "naïve café — 東京タワー 🚀🤖 emoji, Ελληνικά",
    "<|im_start|>user\nhi<|im_end|>",
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi 🚀"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}],
]


@pytest.fixture(scope="module")
def smol_dir(request: pytest.FixtureRequest) -> Path:
    """SmolLM2's tokenizer files, written by transformers from the packaged GGUF.

    Cached in pytest's cache dir (keyed by the GGUF's name and size): the conversion costs
    seconds, the files never change for one GGUF.
    """
    from dataplane.assets import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    dest = Path(request.config.cache.mkdir("adapterplane-smollm2-tokenizer"))
    marker = dest / "source.json"
    source = json.dumps({"gguf": gguf.name, "bytes": gguf.stat().st_size})
    if not marker.is_file() or marker.read_text() != source:
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(dest)
        marker.write_text(source)
    return dest


@pytest.fixture(scope="module")
def smol_ref(smol_dir: Path) -> Any:
    """transformers' reading of the same files: the reference."""
    return AutoTokenizer.from_pretrained(smol_dir)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE trained here: emoji and CJK split into several tokens."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXTS * 3 + ["the quick brown fox jumps over the lazy dog"] * 5,
                            trainer=trainer)
    dest = tmp_path_factory.mktemp("tiny-tok")
    tok.save(str(dest / "tokenizer.json"))
    template = (
        "{{ bos_token }}{% set ns = namespace(n=0) %}"
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
        "{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
        "{% if m['role'] == 'system' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}"
        "[{{ ns.n }}:{{ m['role'] }}]{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] }}{% endgeneration %}{{ eos_token }}{% else %}{{ m['content'] }}"
        "{% endif %}\n{% endfor %}"
        "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False,
                      "special": True},
        "unk_token": "<unk>",
        "chat_template": template,
    }))
    return dest


@pytest.fixture(scope="module")
def metaspace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SentencePiece-style BPE (Metaspace, byte fallback): not byte-level, so it streams
    with the prefix-offset method; a token's leading space depends on its context."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(),
                                     decoders.Fuse()])
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>",
                                        *(f"<0x{b:02X}>" for b in range(256))])
    tok.train_from_iterator(TEXTS * 3 + ["the quick brown fox jumps over the lazy dog"] * 5,
                            trainer=trainer)
    dest = tmp_path_factory.mktemp("metaspace-tok")
    tok.save(str(dest / "tokenizer.json"))
    return dest


def test_encode_decode_match_transformers(smol_dir: Path, smol_ref: Any) -> None:
    ours, ref = Tokenizer.from_dir(smol_dir), smol_ref
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text)["input_ids"]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids)
    assert ours.vocab_size == len(ref)


def test_special_tokens_and_eos_policy(smol_dir: Path, smol_ref: Any, tmp_path: Path) -> None:
    tok, ref = Tokenizer.from_dir(smol_dir), smol_ref
    assert tok.special_tokens["eos_token"] == ref.eos_token
    assert tok.eos_token_ids == {ref.eos_token_id}
    assert tok.token_id("bos_token") == ref.bos_token_id
    copy = tmp_path / "with-gen"
    shutil.copytree(smol_dir, copy)
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    assert Tokenizer.from_dir(copy).eos_token_ids == {0, 2}


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_chat_template_matches_transformers(smol_dir: Path, smol_ref: Any,
                                            add_generation_prompt: bool) -> None:
    ours, ref = Tokenizer.from_dir(smol_dir), smol_ref
    for conv in CONVERSATIONS:
        text = ours.apply_chat_template(conv, add_generation_prompt=add_generation_prompt)
        expected = ref.apply_chat_template(conv, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
        assert text == expected
        ids = ours.encode_chat(conv, add_generation_prompt=add_generation_prompt)
        assert ids == ref(expected, add_special_tokens=False)["input_ids"]


def test_template_globals_match_transformers(tiny_dir: Path) -> None:
    ours, ref = Tokenizer.from_dir(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    tools = [{"type": "function", "function": {"name": "f", "description": "é <b>"}}]
    for conv in CONVERSATIONS:
        for kw in ({}, {"add_generation_prompt": True, "tools": tools}):
            got = ours.apply_chat_template(conv, **kw)  # type: ignore[arg-type]
            assert got == ref.apply_chat_template(conv, tokenize=False, **kw)
    with pytest.raises(ChatTemplateError, match="bad role tool"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        ours.apply_chat_template(CONVERSATIONS[0], chat_template="{% if %}")


def _stream(tok: Tokenizer, prompt: list[int], out: list[int], skip: bool = True) -> str:
    detok = tok.detokenizer(prompt, skip_special_tokens=skip)
    pieces = [detok.push(t) for t in out]
    return "".join(pieces) + detok.flush()


def test_incremental_detok_equals_full_decode(tiny_dir: Path, smol_dir: Path) -> None:
    for d in (tiny_dir, smol_dir):
        tok = Tokenizer.from_dir(d)
        prompt = tok.encode("prompt: ")
        for text in TEXTS:
            out = tok.encode(text, add_special_tokens=False)
            for skip in (True, False):
                assert _stream(tok, prompt, out, skip) == tok.decode(out, skip_special_tokens=skip)


def test_long_random_streams_equal_full_decode(tiny_dir: Path, smol_dir: Path) -> None:
    """Long outputs of random ids (split characters, special tokens, spaces anywhere)
    stream exactly the full decode."""
    rng = random.Random(7)
    for d in (tiny_dir, smol_dir):
        tok = Tokenizer.from_dir(d)
        vocab = tok.vocab_size
        prompt = [rng.randrange(vocab) for _ in range(40)]
        for _ in range(8):
            out = [rng.randrange(vocab) for _ in range(rng.randrange(30, 200))]
            for skip in (True, False):
                assert _stream(tok, prompt, out, skip) == tok.decode(out, skip_special_tokens=skip)


def test_byte_level_tokenizers_stream_by_table(tiny_dir: Path, smol_dir: Path,
                                               metaspace_dir: Path) -> None:
    for d in (tiny_dir, smol_dir):
        tok = Tokenizer.from_dir(d)
        assert tok.is_byte_level and isinstance(tok.detokenizer([1]), ByteLevelDetokenizer)
        assert len(tok.byte_pieces()) == tok.vocab_size
        # an id the tokenizer does not have decodes to nothing, as its own decode
        out = [*tok.encode("ok 🚀", add_special_tokens=False), tok.vocab_size + 3, 5]
        for skip in (True, False):
            assert _stream(tok, [1], out, skip) == tok.decode(out, skip_special_tokens=skip)
    tok = Tokenizer.from_dir(metaspace_dir)
    assert not tok.is_byte_level and isinstance(tok.detokenizer([1]), IncrementalDetokenizer)
    with pytest.raises(TokenizerLoadError):
        tok.byte_pieces()


def test_prefix_offset_streams_equal_decode_in_context(tiny_dir: Path, smol_dir: Path,
                                                      metaspace_dir: Path) -> None:
    """The prefix-offset method (any tokenizer) streams decode(prompt + output) past
    decode(prompt): exactly decode(output) for byte-level ones, random ids included; for
    SentencePiece-style ones the first token's space comes from its context (checked on
    text: random byte-fallback ids make invalid UTF-8, whose U+FFFD count depends on
    where a decode window starts)."""
    rng = random.Random(11)
    for d in (tiny_dir, smol_dir, metaspace_dir):
        tok = Tokenizer.from_dir(d)
        vocab = tok.vocab_size
        streams = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
        if tok.is_byte_level:
            streams += [[rng.randrange(vocab) for _ in range(rng.randrange(30, 120))]
                        for _ in range(6)]
        prompt = tok.encode("the quick brown fox", add_special_tokens=False)
        for out in streams:
            for skip in (True, False):
                detok = IncrementalDetokenizer(
                    lambda ids, s=skip, k=tok: k.decode(ids, skip_special_tokens=s), prompt)
                got = "".join(detok.push(t) for t in out) + detok.flush()
                full = tok.decode(prompt + out, skip_special_tokens=skip)
                before = tok.decode(prompt, skip_special_tokens=skip)
                assert full.startswith(before)
                assert got == full[len(before):]
                if tok.is_byte_level:
                    assert got == tok.decode(out, skip_special_tokens=skip)
    # the engine's streams for the SentencePiece-style tokenizer take the same path
    tok = Tokenizer.from_dir(metaspace_dir)
    out = tok.encode("jumps over the lazy dog", add_special_tokens=False)
    assert _stream(tok, prompt, out) == (tok.decode(prompt + out)[len(tok.decode(prompt)):])


def test_incremental_detok_never_emits_partial_characters(tiny_dir: Path) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    out = tok.encode("🚀東", add_special_tokens=False)
    assert len(out) > 2  # multi-byte characters split over byte tokens
    detok = tok.detokenizer([])
    pieces = [detok.push(t) for t in out]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "🚀東" and detok.flush() == ""
    # a stream cut inside a character flushes the replacement character at the end
    detok = tok.detokenizer([])
    pieces = [detok.push(t) for t in out[:1]]
    assert pieces == [""] and detok.flush() == tok.decode(out[:1])


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError) as exc:
        Tokenizer.from_dir(tmp_path)
    assert exc.value.code == "TOKENIZER_LOAD_ERROR"
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerLoadError):
        Tokenizer.from_dir(tmp_path)


def _feed(tok: Tokenizer, seq: Sequence, out: list[int]) -> list[str]:
    stop = StopChecker(seq, tok.eos_token_ids, tok.detokenizer(seq.prompt_token_ids),
                       max_len=1000)
    pieces = []
    for t in out:
        if seq.is_finished:
            break
        seq.token_ids.append(t)
        pieces.append(stop.on_token(t))
    return pieces


def test_stop_string_across_multibyte_tokens(tiny_dir: Path) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    out = tok.encode("the fox 🚀 jumps over", add_special_tokens=False)
    seq = Sequence("s", (1,), SamplingParams(max_tokens=50, stop=["🚀 j", "zzz"]))
    pieces = _feed(tok, seq, out)
    assert seq.finish_reason is FinishReason.STOP and seq.stop_reason == "🚀 j"
    assert seq.output_text == "the fox " == "".join(pieces)
    assert all("\ufffd" not in p for p in pieces)


def test_eos_and_length_flush_held_text(tiny_dir: Path) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    eos = tok.token_id("eos_token")
    assert eos is not None and tok.eos_token_ids == {eos}
    out = tok.encode("ok 🚀", add_special_tokens=False)
    assert tok.decode(out[:-1]).endswith("\ufffd")  # the cut leaves an incomplete character
    seq = Sequence("e", (1,), SamplingParams(max_tokens=50))
    pieces = _feed(tok, seq, [*out[:-1], eos])  # eos cuts the emoji: held bytes are flushed
    assert seq.finish_reason is FinishReason.STOP and seq.stop_reason == eos
    assert "".join(pieces) == seq.output_text == tok.decode(out[:-1])
    seq = Sequence("l", (1,), SamplingParams(max_tokens=len(out) - 1))
    pieces = _feed(tok, seq, out)
    assert seq.finish_reason is FinishReason.LENGTH
    assert "".join(pieces) == seq.output_text == tok.decode(out[:-1])
