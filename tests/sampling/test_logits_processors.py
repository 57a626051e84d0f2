"""Batched logit adjustments vs a per-row float64 loop written from their definitions;
rows that ask for nothing are untouched; async placeholders read the pending tokens."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.core import PLACEHOLDER_TOKEN, InvalidSamplingParams, SamplingParams, Sequence
from dataplane.sampling.logits_processors import (
    LogitsAdjuster,
    LogitsProcessorError,
    PendingTokens,
)

V = 24
EOS = 3


def _reference(row: list[float], prompt: list[int], output: list[int],
               p: SamplingParams) -> list[float]:
    x = [float(v) for v in row]
    for t, b in p.logit_bias:
        x[t] += b
    if len(output) < p.min_tokens:
        for t in {*p.stop_token_ids, *(() if p.ignore_eos else (EOS,))}:
            x[t] = -math.inf
    counts = {t: output.count(t) for t in set(output)}
    for t in range(V):
        if p.repetition_penalty != 1.0 and (t in counts or t in prompt):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        if t in counts:
            x[t] -= p.frequency_penalty * counts[t] + p.presence_penalty
    return x


def _seq(rid: str, prompt: list[int], output: list[int], p: SamplingParams) -> Sequence:
    seq = Sequence(rid, tuple(prompt), p)
    seq.token_ids.extend(output)
    return seq


params_st = st.builds(
    SamplingParams,
    max_tokens=st.just(20),
    min_tokens=st.sampled_from([0, 0, 3, 20]),
    ignore_eos=st.booleans(),
    stop_token_ids=st.lists(st.integers(0, V - 1), max_size=2),
    logit_bias=st.dictionaries(st.integers(0, V - 1), st.floats(-100, 100), max_size=4),
    repetition_penalty=st.sampled_from([1.0, 1.0, 0.5, 1.3, 2.0]),
    frequency_penalty=st.sampled_from([0.0, 0.0, -2.0, 0.7, 2.0]),
    presence_penalty=st.sampled_from([0.0, 0.0, -1.0, 1.5]),
)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(params_st, st.lists(st.integers(0, V - 1), min_size=1,
                                                   max_size=6),
                               st.lists(st.integers(0, V - 1), max_size=8)),
                     min_size=1, max_size=5),
       seed=st.integers(0, 2**31 - 1))
def test_batched_adjustments_equal_the_per_row_definition(
        rows: list[tuple[SamplingParams, list[int], list[int]]], seed: int) -> None:
    logits = torch.randn(len(rows), V, generator=torch.Generator().manual_seed(seed)) * 4
    seqs = [_seq(f"r{i}", prompt, out, p) for i, (p, prompt, out) in enumerate(rows)]
    got = logits.clone()
    assert LogitsAdjuster({EOS}).adjust(got, seqs) == any(p.adjusts_logits for p, _, _ in rows)
    for i, (p, prompt, out) in enumerate(rows):
        ref = torch.tensor(_reference(logits[i].tolist(), prompt, out, p), dtype=torch.float64)
        if not p.adjusts_logits:
            assert torch.equal(got[i], logits[i])
        torch.testing.assert_close(got[i].double(), ref, atol=1e-4, rtol=1e-5)


def test_placeholder_reads_the_pending_device_token() -> None:
    p = SamplingParams(frequency_penalty=2.0, max_tokens=8)
    logits = torch.zeros(2, V)
    other = _seq("other", [1], [5], SamplingParams())
    seq = _seq("a", [1], [5, PLACEHOLDER_TOKEN], p)
    pending = PendingTokens(torch.tensor([7, 9]), [other, seq])  # seq's token is 9
    got = logits.clone()
    LogitsAdjuster().adjust(got, [other, seq], pending)
    assert got[1, 5].item() == -2.0 and got[1, 9].item() == -2.0
    assert int((got[1] != 0).sum()) == 2 and torch.equal(got[0], logits[0])
    with pytest.raises(LogitsProcessorError):
        LogitsAdjuster().adjust(logits.clone(), [other, seq], None)
    with pytest.raises(LogitsProcessorError):
        LogitsAdjuster().adjust(logits.clone(), [other, seq],
                                PendingTokens(torch.tensor([7]), [other]))


def test_cached_prompts_follow_the_request_not_its_id() -> None:
    """A new request reusing an id must not be penalised with the old one's prompt."""
    adjuster = LogitsAdjuster()
    p = SamplingParams(repetition_penalty=2.0, max_tokens=8)
    first = torch.ones(1, V)
    adjuster.adjust(first, [_seq("r", [1, 2], [], p)])
    assert first[0, 1].item() == 0.5 and first[0, 5].item() == 1.0
    again = torch.ones(1, V)
    adjuster.adjust(again, [_seq("r", [5, 6], [], p)])
    assert again[0, 5].item() == 0.5 and again[0, 1].item() == 1.0


@pytest.mark.parametrize("kwargs", [
    dict(min_tokens=17), dict(min_tokens=-1), dict(logit_bias={1: 100.5}),
    dict(logit_bias={-2: 1.0}), dict(logit_bias={1: float("nan")}),
    dict(logit_bias=[(1, 1.0), (1, 2.0)]), dict(logit_bias={i: 1.0 for i in range(1025)}),
    dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(frequency_penalty=True),
    dict(repetition_penalty=0), dict(repetition_penalty=2.5),
    dict(repetition_penalty=float("inf")),
])
def test_bad_controls_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidSamplingParams):
        SamplingParams(max_tokens=16, **kwargs)  # type: ignore[arg-type]


def test_logit_bias_is_normalised_sorted() -> None:
    p = SamplingParams(logit_bias={9: -1, 2: 0.5})  # type: ignore[arg-type]
    assert p.logit_bias == ((2, 0.5), (9, -1)) and p.adjusts_logits
    assert p == SamplingParams(logit_bias=[(9, -1), (2, 0.5)])  # type: ignore[arg-type]
    assert not SamplingParams().adjusts_logits


def test_min_tokens_with_nothing_to_hold_back_leaves_logits_alone() -> None:
    """`min_tokens` with eos ignored and no stop token ids (how load generators ask for
    fixed-length outputs) suppresses nothing, so the row takes the unadjusted path; with
    eos kept or a stop token id it adjusts."""
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1))
    fixed = SamplingParams(max_tokens=8, min_tokens=8, ignore_eos=True)
    assert not fixed.adjusts_logits
    got = logits.clone()
    assert LogitsAdjuster({EOS}).adjust(got, [_seq("r", [1], [], fixed)]) is False
    assert torch.equal(got, logits)
    for p in (SamplingParams(max_tokens=8, min_tokens=8),
              SamplingParams(max_tokens=8, min_tokens=8, ignore_eos=True, stop_token_ids=[5])):
        got = logits.clone()
        assert LogitsAdjuster({EOS}).adjust(got, [_seq("r", [1], [], p)]) is True
        assert got[0, EOS if not p.ignore_eos else 5] == -math.inf
