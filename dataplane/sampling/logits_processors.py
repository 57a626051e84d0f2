"""Per-row logit adjustments before temperature / top-k / top-p, batched over the rows.

Each kind is a few device ops over the (row, token) pairs it touches, never a dense pass
over [rows, vocab] and never a per-row loop over the vocabulary. Order, as vLLM's:

1. `logit_bias`: logits[row, token] += bias.
2. `min_tokens`: while a request has generated fewer than `min_tokens` tokens, its stop
   tokens (eos unless `ignore_eos`, and `stop_token_ids`) are set to -inf.
3. Penalties over the tokens seen so far: repetition (HF's: a seen token's logit is divided
   by the penalty when positive, multiplied when not; seen = prompt or output), then
   presence (minus penalty once the token is in the output) and frequency (minus penalty
   x the token's count in the output).

Repetition and presence rewrite each touched logit from its value before the write, so a
token listed twice writes the same value twice (no de-duplication, no device sync);
frequency accumulates. The logits are adjusted in place: the sampler takes the logprobs'
log-softmax first.

A request's prompt token ids go to the device once and stay cached while the request keeps
asking (`LogitsAdjuster`); output ids are listed per step. Async scheduling launches a
decode step before the previous step's tokens reach the host, so a sequence's last output
token may be PLACEHOLDER_TOKEN; `PendingTokens` names the device tensor holding the real
ids, read there (no host sync).
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


class LogitsAdjuster:
    """Applies every row's adjustments; caches the prompt ids of repetition-penalised
    requests on the device (an entry lives while its request is in the steps it samples)."""

    def __init__(self, eos_token_ids: Iterable[int] = ()) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        self._prompts: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}
        """request id -> (its prompt tuple, those ids on the device); a hit needs the very
        same tuple object, so a new request reusing an id never reads another's prompt."""

    def adjust(self, logits: torch.Tensor, seqs: SequenceOf[Sequence],
               pending: PendingTokens | None = None) -> bool:
        """float32 logits [N, V] for seqs [N], adjusted in place; False (untouched) when
        no row asks for an adjustment."""
        params = [s.sampling for s in seqs]
        if not any(p.adjusts_logits for p in params):
            self._prompts.clear()
            return False
        v, dev = logits.shape[1], logits.device
        flat = logits.view(-1)
        rows: list[int] = []
        bias: list[float] = []
        for i, p in enumerate(params):
            for token, b in p.logit_bias:
                rows.append(i * v + token)
                bias.append(b)
        if rows:
            flat.index_add_(0, to_device(rows, torch.int64, dev),
                            to_device(bias, torch.float32, dev))
        rows = []
        for i, (seq, p) in enumerate(zip(seqs, params, strict=True)):
            if seq.num_output_tokens < p.min_tokens:
                stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
                rows.extend(i * v + t for t in sorted(stops) if t < v)
        if rows:
            flat.index_fill_(0, to_device(rows, torch.int64, dev), float("-inf"))
        penalized = [i for i, p in enumerate(params) if p.penalized]
        if penalized:
            self._penalize(flat, v, seqs, penalized, pending)
        else:
            self._prompts.clear()
        return True

    def _penalize(self, flat: torch.Tensor, v: int, seqs: SequenceOf[Sequence],
                  rows: list[int], pending: PendingTokens | None) -> None:
        dev = flat.device
        out_idx = self._output_index(v, seqs, rows, pending, dev)
        params = [seqs[i].sampling for i in rows]
        row_of_out = out_idx // v
        if any(p.repetition_penalty != 1.0 for p in params):
            rep_rows = [i for i in rows if seqs[i].sampling.repetition_penalty != 1.0]
            seen = torch.cat([self._prompt_index(v, seqs, rep_rows, dev), out_idx])
            rep = torch.ones(len(seqs), dtype=torch.float32, device=dev)
            rep[to_device(rows, torch.int64, dev)] = to_device(
                [p.repetition_penalty for p in params], torch.float32, dev)
            x = flat[seen]
            r = rep[seen // v]
            flat[seen] = torch.where(x > 0, x / r, x * r)
        else:
            self._prompts.clear()
        if any(p.presence_penalty for p in params):
            pres = torch.zeros(len(seqs), dtype=torch.float32, device=dev)
            pres[to_device(rows, torch.int64, dev)] = to_device(
                [p.presence_penalty for p in params], torch.float32, dev)
            flat[out_idx] = flat[out_idx] - pres[row_of_out]
        if any(p.frequency_penalty for p in params):
            freq = torch.zeros(len(seqs), dtype=torch.float32, device=dev)
            freq[to_device(rows, torch.int64, dev)] = to_device(
                [p.frequency_penalty for p in params], torch.float32, dev)
            flat.index_add_(0, out_idx, -freq[row_of_out])

    @staticmethod
    def _output_index(v: int, seqs: SequenceOf[Sequence], rows: list[int],
                      pending: PendingTokens | None, dev: torch.device) -> torch.Tensor:
        """Flat indices row * V + token of every output token of `rows` (duplicates kept);
        a trailing placeholder reads its token from `pending` on the device."""
        base: list[int] = []
        tokens: list[int] = []
        waiting: list[str] = []
        src: list[int] = []
        for i in rows:
            seq = seqs[i]
            out = seq.output_token_ids
            base.extend([i * v] * len(out))
            tokens.extend(out)
            if out and out[-1] == PLACEHOLDER_TOKEN:
                waiting.append(seq.request_id)
        idx = to_device(base, torch.int64, dev)
        tok = to_device(tokens, torch.int64, dev)
        if waiting:
            if pending is None or any(r not in pending.row_of for r in waiting):
                raise LogitsProcessorError("a placeholder token the pending tokens do not hold",
                                           request_ids=waiting)
            for i in rows:
                seq = seqs[i]
                src.extend([pending.row_of.get(seq.request_id, 0)] * seq.num_output_tokens)
            fill = pending.tokens[to_device(src, torch.int64, dev)]
            tok = torch.where(tok == PLACEHOLDER_TOKEN, fill, tok)
        return idx + tok

    def _prompt_index(self, v: int, seqs: SequenceOf[Sequence], rows: list[int],
                      dev: torch.device) -> torch.Tensor:
        """Flat indices of `rows`' prompt tokens, from the device-cached prompt ids."""
        keep: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}
        parts: list[torch.Tensor] = []
        lengths: list[int] = []
        for i in rows:
            seq = seqs[i]
            hit = self._prompts.get(seq.request_id)
            if hit is None or hit[0] is not seq.prompt_token_ids or hit[1].device != dev:
                hit = (seq.prompt_token_ids, to_device(list(seq.prompt_token_ids), torch.int64,
                                                       dev))
            keep[seq.request_id] = hit
            parts.append(hit[1])
            lengths.append(len(seq.prompt_token_ids))
        self._prompts = keep
        offsets = torch.repeat_interleave(
            to_device([i * v for i in rows], torch.int64, dev),
            to_device(lengths, torch.int64, dev), output_size=sum(lengths))
        return torch.cat(parts) + offsets
