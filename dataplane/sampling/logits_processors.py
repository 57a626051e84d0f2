"""Per-row logit adjustments before temperature / top-k / top-p, batched over the rows.

Each kind is one device op over the rows that ask for it (the host only builds the small
index lists: never a per-row pass over the vocabulary). Order, as vLLM's:

1. `logit_bias`: logits[row, token] += bias.
2. `min_tokens`: while a request has generated fewer than `min_tokens` tokens, its stop
   tokens (eos unless `ignore_eos`, and `stop_token_ids`) are set to -inf.
3. Penalties over the tokens seen so far: repetition (HF's: a seen token's logit is divided
   by the penalty when positive, multiplied when not; seen = prompt or output), then
   frequency (minus penalty x the token's count in the output) and presence (minus penalty
   once the token is in the output).

The raw logits are not modified (logprobs report the model's distribution, sampler.py).

Async scheduling launches a decode step before the previous step's tokens reach the host,
so a sequence's last output token may be PLACEHOLDER_TOKEN; `PendingTokens` names the
device tensor holding the real ids, and the penalty counts read them there (no host sync).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from functools import cached_property

import torch

from dataplane.core import PLACEHOLDER_TOKEN, EngineError, Sequence
from dataplane.h2d import to_device


class LogitsProcessorError(EngineError):
    code = "SAMPLER_ERROR"


@dataclass(frozen=True)
class PendingTokens:
    """The previous step's sampled tokens [N_prev] on the device and the sequences it
    sampled, in that order (the placeholder of `seqs[k]` is `tokens[k]`)."""

    tokens: torch.Tensor
    seqs: SequenceOf[Sequence]

    @cached_property
    def row_of(self) -> dict[str, int]:
        return {s.request_id: k for k, s in enumerate(self.seqs)}


def adjust_logits(logits: torch.Tensor, seqs: SequenceOf[Sequence],
                  eos_token_ids: Iterable[int] = (),
                  pending: PendingTokens | None = None) -> torch.Tensor:
    """float32 logits [N, V] for seqs [N] -> the adjusted logits (a new tensor when a row
    asks for an adjustment, else `logits` itself)."""
    params = [s.sampling for s in seqs]
    if not any(p.adjusts_logits for p in params):
        return logits
    out = logits.clone()
    v, dev = logits.shape[1], logits.device
    rows: list[int] = []
    cols: list[int] = []
    bias: list[float] = []
    for i, p in enumerate(params):
        for token, b in p.logit_bias:
            rows.append(i)
            cols.append(token)
            bias.append(b)
    if rows:
        out.index_put_((to_device(rows, torch.int64, dev), to_device(cols, torch.int64, dev)),
                       to_device(bias, torch.float32, dev), accumulate=True)
    eos = tuple(eos_token_ids)
    rows, cols = [], []
    for i, (seq, p) in enumerate(zip(seqs, params, strict=True)):
        if seq.num_output_tokens < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
            for token in sorted(t for t in stops if t < v):
                rows.append(i)
                cols.append(token)
    if rows:
        out[to_device(rows, torch.int64, dev), to_device(cols, torch.int64, dev)] = float("-inf")
    penalized = [i for i, p in enumerate(params) if p.penalized]
    if penalized:
        _penalize(out, [seqs[i] for i in penalized], penalized, pending)
    return out


def _padded(lists: list[list[int]], pad: int, dev: torch.device) -> torch.Tensor:
    width = max(1, max(len(x) for x in lists))
    flat = [t for x in lists for t in (*x, *([pad] * (width - len(x))))]
    return to_device(flat, torch.int64, dev).view(len(lists), width)


def _penalize(out: torch.Tensor, seqs: list[Sequence], rows: list[int],
              pending: PendingTokens | None) -> None:
    """Repetition, frequency and presence penalties on `out[rows]` in place."""
    v, dev = out.shape[1], out.device
    params = [s.sampling for s in seqs]
    ids = _padded([s.output_token_ids for s in seqs], v, dev)  # pad: the dump column v
    waiting = [s.request_id for s in seqs if s.token_ids[-1] == PLACEHOLDER_TOKEN]
    if waiting:
        if pending is None or any(r not in pending.row_of for r in waiting):
            raise LogitsProcessorError("a placeholder token the pending tokens do not hold",
                                       request_ids=waiting)
        src = to_device([pending.row_of.get(s.request_id, 0) for s in seqs], torch.int64, dev)
        ids = torch.where(ids == PLACEHOLDER_TOKEN, pending.tokens[src].unsqueeze(1), ids)
    counts = torch.zeros(len(seqs), v + 1, dtype=torch.float32, device=dev)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    counts = counts[:, :v]
    index = to_device(rows, torch.int64, dev)
    sub = out.index_select(0, index)
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = counts > 0
        prompt = _padded([list(s.prompt_token_ids) for s in seqs], v, dev)
        in_prompt = torch.zeros(len(seqs), v + 1, dtype=torch.bool, device=dev)
        in_prompt.scatter_(1, prompt, True)
        seen |= in_prompt[:, :v]
        rep = to_device([p.repetition_penalty for p in params], torch.float32, dev).unsqueeze(1)
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    freq = to_device([p.frequency_penalty for p in params], torch.float32, dev).unsqueeze(1)
    pres = to_device([p.presence_penalty for p in params], torch.float32, dev).unsqueeze(1)
    sub = sub - freq * counts - pres * (counts > 0).float()
    out.index_copy_(0, index, sub)
