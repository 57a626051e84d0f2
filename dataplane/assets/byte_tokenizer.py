"""Byte-level tokenizers for test and benchmark models: GPT-2's byte table, and a synthetic
vocabulary of any size for random-weight bases (the grammar compiler reads every token)."""

from __future__ import annotations

import random

from dataplane.tokenizer import Tokenizer


def synthetic_tokenizer(vocab_size: int, eos_token_id: int, seed: int = 0) -> Tokenizer:
    """A byte-level BPE tokenizer of exactly `vocab_size` ids for random-weight bases (the
    structured-output benchmark needs one: the grammar compiler reads every token's bytes):
    the 256 bytes, then distinct random 2-8 character pieces of letters, digits and JSON
    punctuation, half of them with a leading space, as a real vocabulary has. `eos_token_id`
    is a special token."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_{}[]\":,."
    gen = random.Random(seed)
    while len(vocab) < vocab_size:
        piece = "".join(gen.choice(alphabet) for _ in range(gen.randint(2, 8)))
        if gen.random() < 0.5:
            piece = " " + piece
        vocab.setdefault("".join(table[b] for b in piece.encode()), len(vocab))
    eos = next(t for t, i in vocab.items() if i == eos_token_id)
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([eos])
    return Tokenizer(hf, special_tokens={"eos_token": eos}, eos_token_ids=[eos_token_id],
                     chat_template=None)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}
