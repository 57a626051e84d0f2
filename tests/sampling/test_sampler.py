"""Sampler vs independent float64 computations; seeded draws are batch-composition invariant."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from dataplane.core import InvalidSamplingParams, SamplingParams, Sequence
from dataplane.sampling import Sampler
from dataplane.sampling.sampler import SamplerError, processed_probs

V = 32


def _ref_probs(row: list[float], sp: SamplingParams) -> list[float]:
    """Float64 reference: temperature -> top-k (ties kept) -> top-p -> softmax."""
    if sp.temperature == 0:
        best = max(range(len(row)), key=lambda i: (row[i], -i))
        return [1.0 if i == best else 0.0 for i in range(len(row))]
    x = [v / sp.temperature for v in row]
    if 0 < sp.top_k < len(x):
        kth = sorted(x, reverse=True)[sp.top_k - 1]
        x = [v if v >= kth else -math.inf for v in x]

    def softmax(z: list[float]) -> list[float]:
        m = max(z)
        e = [math.exp(v - m) if v != -math.inf else 0.0 for v in z]
        s = sum(e)
        return [v / s for v in e]

    if sp.top_p < 1.0:
        p = softmax(x)
        order = sorted(range(len(p)), key=lambda i: -p[i])
        mass, keep = 0.0, set()
        for i in order:
            if mass >= sp.top_p:
                break
            keep.add(i)
            mass += p[i]
        x = [v if i in keep else -math.inf for i, v in enumerate(x)]
    return softmax(x)


def _ref_uniform(seed: int, step: int) -> float:
    d = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(d, "little") & (2**63 - 1))
    return float(torch.rand((), generator=gen, dtype=torch.float64))


def _ref_token(row: list[float], sp: SamplingParams, step: int) -> int:
    probs = _ref_probs(row, sp)
    assert sp.seed is not None
    target = _ref_uniform(sp.seed, step) * sum(probs)
    acc = 0.0
    for i, p in enumerate(probs):
        acc += p
        if acc > target:
            return i
    return len(probs) - 1


def _seq(rid: str, sp: SamplingParams, n_out: int = 0) -> Sequence:
    seq = Sequence(rid, (1, 2, 3), sp)
    seq.token_ids.extend([5] * n_out)
    return seq


PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, seed=1),
    SamplingParams(temperature=1.3, top_k=5, seed=2),
    SamplingParams(temperature=1.0, top_p=0.6, seed=3),
    SamplingParams(temperature=0.9, top_k=8, top_p=0.8, seed=4),
    SamplingParams(temperature=1.0, top_k=1, seed=5),
]


def test_processed_probs_match_float64_reference() -> None:
    logits = torch.randn(len(PARAMS), V, generator=torch.Generator().manual_seed(0)) * 3
    got = processed_probs(logits, PARAMS).double()
    for i, sp in enumerate(PARAMS):
        ref = torch.tensor(_ref_probs(logits[i].double().tolist(), sp), dtype=torch.float64)
        torch.testing.assert_close(got[i], ref, atol=1e-6, rtol=1e-5)


def test_seeded_tokens_match_reference_and_ignore_batch_composition() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(len(PARAMS), V, generator=g) * 2
    seqs = [_seq(f"r{i}", sp, n_out=i) for i, sp in enumerate(PARAMS)]
    batch = Sampler(seed=0).sample(logits, seqs).token_ids
    for i, sp in enumerate(PARAMS):
        row = logits[i].double().tolist()
        ref = row.index(max(row)) if sp.greedy else _ref_token(row, sp, step=i)
        assert batch[i] == ref
        # alone, and inside another batch at another row, with unrelated neighbours
        alone = Sampler(seed=99).sample(logits[i:i + 1], [seqs[i]]).token_ids
        noise = torch.randn(3, V, generator=g)
        mixed = torch.cat([noise[:2], logits[i:i + 1], noise[2:]])
        others = [_seq("x", SamplingParams(temperature=1.0)),
                  _seq("y", SamplingParams(temperature=0.5, seed=7)),
                  seqs[i], _seq("z", SamplingParams(top_p=0.3))]
        assert alone == [batch[i]] == [Sampler().sample(mixed, others).token_ids[2]]


def test_seed_and_step_change_the_draw_and_frequencies_follow_probs() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    counts = [0, 0, 0, 0]
    sampler = Sampler()
    for step in range(400):
        seq = _seq("r", SamplingParams(seed=12345), n_out=step)
        counts[sampler.sample(logits, [seq]).token_ids[0]] += 1
    # 400 draws: every bucket within 5 standard deviations of its expectation
    for c, p in zip(counts, [0.1, 0.2, 0.3, 0.4], strict=True):
        assert abs(c - 400 * p) < 5 * math.sqrt(400 * p * (1 - p))


def test_greedy_picks_first_maximum() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    out = Sampler().sample(logits, [_seq("g", SamplingParams(temperature=0.0))])
    assert out.token_ids == [1] and out.logprobs == [None]


def test_logprobs_are_raw_log_softmax() -> None:
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(3))
    seqs = [_seq("a", SamplingParams(temperature=0.0, logprobs=3)),
            _seq("b", SamplingParams(temperature=2.0, top_k=4, seed=1, logprobs=0))]
    out = Sampler().sample(logits, seqs)
    for i, seq in enumerate(seqs):
        row = logits[i].double()
        ref = (row - torch.logsumexp(row, 0)).tolist()
        lp = out.logprobs[i]
        assert lp is not None and lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(ref[lp.token_id], abs=1e-5)
        n = seq.sampling.logprobs or 0
        best = sorted(range(V), key=lambda j: -ref[j])[:n]
        assert [t for t, _ in lp.top] == best
        assert [v for _, v in lp.top] == pytest.approx([ref[j] for j in best], abs=1e-5)


def test_shape_errors() -> None:
    with pytest.raises(SamplerError):
        Sampler().sample(torch.zeros(2, V), [_seq("a", SamplingParams())])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_k=-1),
        dict(top_p=0.0), dict(top_p=1.5), dict(seed=-1), dict(max_tokens=0),
        dict(max_tokens=True), dict(stop_token_ids=[-3]), dict(stop=[""]),
        dict(logprobs=21), dict(ignore_eos="yes"),
    ],
)
def test_sampling_params_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidSamplingParams) as exc:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert exc.value.code == "INVALID_SAMPLING_PARAMS"


def test_sampling_params_normalise_sequences() -> None:
    sp = SamplingParams(stop_token_ids=[3, 4], stop="END")  # type: ignore[arg-type]
    assert sp.stop_token_ids == (3, 4) and sp.stop == ("END",)
    assert hash(sp) == hash(SamplingParams(stop_token_ids=(3, 4), stop=("END",)))


def test_tiny_temperatures_are_greedy() -> None:
    logits = torch.tensor([[0.0, 1e-3, 2.0, 1.0]])
    seq = _seq("t", SamplingParams(temperature=1e-7, seed=3))
    assert seq.sampling.greedy
    assert Sampler().sample(logits, [seq]).token_ids == [2]
    assert not SamplingParams(temperature=1e-3).greedy
