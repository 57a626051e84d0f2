"""Sampler over float32 logits [N, vocab]: greedy, temperature, top-k, top-p, seeds, logprobs.

Row i is sampled with seqs[i].sampling. Processing order (as HF/vLLM): temperature, top-k
(keep logits >= the k-th largest, ties kept), top-p (keep the smallest descending-probability
prefix whose mass reaches p; the most likely token always stays), softmax.

Reproducibility: each sampled row draws one float64 uniform u from its own CPU
`torch.Generator` seeded from (request seed, output-step index), then takes the first token
whose cumulative probability exceeds u * total mass. A request's draw therefore depends only
on its own seed, step and logits row — not on batch composition, row position or device RNG
— and survives preemption (the step index is the number of tokens already generated).
Unseeded rows draw from the sampler's own generator.

Before temperature, each row's logit adjustments apply (logit_bias, min_tokens, penalties:
logits_processors.py), then the grammar masks of constrained rows (grammar.py); greedy rows
take the argmax of the adjusted logits. Logprobs are the
model's raw log-softmax (before any adjustment, temperature, top-k or top-p), as OpenAI
reports them: the chosen token's, plus the top `logprobs` alternatives.

Two phases (async scheduling, engine.py): `launch` enqueues every device op of a step's
sampling — host-built per-row parameters go up through pinned non-blocking copies, results
come down into pinned host buffers followed by a recorded event — without a host sync, and
returns a `PendingSample` whose `tokens` device tensor can feed the next step's input ids;
`PendingSample.result()` waits for that event and returns the lists. `sample` = both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass

import torch

from dataplane.core import EngineError, SamplingParams, Sequence
from dataplane.h2d import to_device
from dataplane.sampling.grammar import apply_bitmask
from dataplane.sampling.logits_processors import LogitsAdjuster, PendingTokens


class SamplerError(EngineError):
    code = "SAMPLER_ERROR"


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]  # None where the request asked for none


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """Enqueue a device -> host copy (pinned, non-blocking on CUDA); valid after the event."""
    if t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class PendingSample:
    """One launched sampling step: `tokens` [N] int64 on the logits' device (usable by later
    device work at once); `result()` blocks until the host copies landed (idempotent)."""

    def __init__(self, tokens: torch.Tensor, host: tuple[torch.Tensor, ...],
                 want: list[int | None]) -> None:
        self.tokens = tokens
        self._host = host  # (tokens, [chosen logprobs, top values, top ids])
        self._want = want
        self._event: torch.cuda.Event | None = None
        if tokens.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()
        self._result: SampleResult | None = None

    def result(self) -> SampleResult:
        if self._result is None:
            if self._event is not None:
                self._event.synchronize()
            token_list = [int(t) for t in self._host[0].tolist()]
            logprobs: list[TokenLogprobs | None] = [None] * len(token_list)
            if len(self._host) > 1:
                chosen = self._host[1].tolist()
                top_v, top_i = self._host[2].tolist(), self._host[3].tolist()
                for i, w in enumerate(self._want):
                    if w is not None:
                        top = tuple(zip(top_i[i][:w], top_v[i][:w], strict=True))
                        logprobs[i] = TokenLogprobs(token_list[i], float(chosen[i]), top)
            self._result = SampleResult(token_list, logprobs)
            self._host = ()
        return self._result


def step_seed(seed: int, step: int) -> int:
    """Seed of a request's `step`-th draw: 63 bits of BLAKE2b(seed, step)."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def processed_probs(logits: torch.Tensor, params: SequenceOf[SamplingParams]) -> torch.Tensor:
    """Sampling distribution [N, V] float32 after temperature, top-k and top-p.

    Greedy rows (SamplingParams.greedy) are returned as a one-hot at the argmax.
    """
    v = logits.shape[1]
    dev = logits.device
    temps = to_device([1.0 if p.greedy else p.temperature for p in params], torch.float32, dev)
    scaled = logits / temps.unsqueeze(1)
    ks = [p.top_k if 0 < p.top_k < v else v for p in params]
    if any(k < v for k in ks):
        sorted_desc = scaled.sort(dim=-1, descending=True).values
        kth = sorted_desc.gather(1, to_device(ks, torch.int64, dev).unsqueeze(1) - 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if any(p.top_p < 1.0 for p in params):  # decided on the host: no device sync
        top_p = to_device([p.top_p for p in params], torch.float32, dev)
        probs = scaled.softmax(dim=-1)
        sp, idx = probs.sort(dim=-1, descending=True, stable=True)
        before = sp.cumsum(dim=-1) - sp  # mass strictly before each token
        drop_sorted = before >= top_p.unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted)
        scaled = scaled.masked_fill(drop & (top_p < 1.0).unsqueeze(1), float("-inf"))
    probs = scaled.softmax(dim=-1)
    if any(p.greedy for p in params):
        greedy = to_device([p.greedy for p in params], torch.bool, dev)
        onehot = torch.zeros_like(probs).scatter(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), onehot, probs)
    return probs


class Sampler:
    def __init__(self, seed: int | None = None, eos_token_ids: frozenset[int] = frozenset()
                 ) -> None:
        self.eos_token_ids = eos_token_ids
        """The stop tokens `min_tokens` holds back besides each request's stop_token_ids."""
        self.adjuster = LogitsAdjuster(eos_token_ids)
        self._rng = torch.Generator()
        if seed is None:
            self._rng.seed()
        else:
            self._rng.manual_seed(seed)

    def _uniforms(self, seqs: SequenceOf[Sequence]) -> torch.Tensor:
        out = torch.empty(len(seqs), dtype=torch.float64)
        for i, seq in enumerate(seqs):
            seed = seq.sampling.seed
            if seed is None:
                gen = self._rng
            else:
                gen = torch.Generator().manual_seed(step_seed(seed, seq.num_output_tokens))
            out[i] = torch.rand((), generator=gen, dtype=torch.float64)
        return out

    def sample(self, logits: torch.Tensor, seqs: SequenceOf[Sequence]) -> SampleResult:
        """logits [N, V] (any float dtype, any device) for seqs [N] -> N token ids (+logprobs)."""
        return self.launch(logits, seqs).result()

    def score(self, logits: torch.Tensor, targets: SequenceOf[int],
              top: SequenceOf[int]) -> PendingSample:
        """Enqueue the log-probabilities of `targets` [N] under logits [N, V] and each row's
        `top[i]` most likely alternatives (prompt logprobs), without a host sync; the
        result's `logprobs[i]` is row i's TokenLogprobs."""
        lp = logits.float().log_softmax(dim=-1)
        tokens = to_device(list(targets), torch.int64, logits.device)
        chosen = lp.gather(1, tokens.unsqueeze(1)).squeeze(1)
        top_v, top_i = lp.topk(max(top, default=0), dim=-1)
        return PendingSample(tokens, (_to_host(tokens), _to_host(chosen), _to_host(top_v),
                                      _to_host(top_i)), list(top))

    def launch(self, logits: torch.Tensor, seqs: SequenceOf[Sequence],
               pending: PendingTokens | None = None,
               masks: tuple[torch.Tensor, SequenceOf[int]] | None = None) -> PendingSample:
        """Enqueue sampling of logits [N, V] for seqs [N] without a host sync.

        Reads each seq's sampling params, tokens and `num_output_tokens` (the seeded draw's
        step index) now; `pending` holds the tokens of seqs whose last token is still a
        placeholder (async scheduling); `masks` = (bitmask, rows): the grammar masks of
        constrained rows (grammar.apply_bitmask), applied after the logit adjustments.
        `logits` may be overwritten by device work enqueued after this call."""
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise SamplerError("logits must be [len(seqs), vocab]", shape=tuple(logits.shape),
                               num_seqs=len(seqs))
        given, logits = logits, logits.float()
        dev = logits.device
        params = [s.sampling for s in seqs]
        want = [p.logprobs for p in params]
        lp = logits.log_softmax(dim=-1) if any(w is not None for w in want) else None
        if masks is not None or any(p.adjusts_logits for p in params):
            if logits is given:  # adjusted in place: the caller's logits stay the model's
                logits = logits.clone()
            self.adjuster.adjust(logits, seqs, pending)
            if masks is not None:
                apply_bitmask(logits, masks[0], masks[1])
        tokens = logits.argmax(dim=-1)
        if any(not p.greedy for p in params):
            cdf = processed_probs(logits, params).double().cumsum(dim=-1)
            u = self._uniforms(seqs)
            target = (u.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda"
                      else u.to(dev)) * cdf[:, -1]
            drawn = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
            drawn = drawn.clamp_(max=logits.shape[1] - 1)
            if any(p.greedy for p in params):
                is_greedy = to_device([p.greedy for p in params], torch.bool, dev)
                tokens = torch.where(is_greedy, tokens, drawn)
            else:
                tokens = drawn
        host: tuple[torch.Tensor, ...] = (_to_host(tokens),)
        if lp is not None:
            chosen = lp.gather(1, tokens.unsqueeze(1)).squeeze(1)
            top_v, top_i = lp.topk(max(w or 0 for w in want), dim=-1)
            host += (_to_host(chosen), _to_host(top_v), _to_host(top_i))
        return PendingSample(tokens, host, want)
