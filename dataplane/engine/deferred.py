"""Input ids that are still on the device: the previous step's sampled tokens (async scheduling).

When step N+1 is launched before step N's tokens reach the host, each N+1 decode row of a
sequence that step N samples has PLACEHOLDER_TOKEN as its plan input id. `DeferredTokens`
names where the real ids are: `tokens[src[k]]` (step N's sampled-token tensor, in N's
`sample_request_ids` order) is the input id of packed row `dst[k]`. The runner writes them
into its input-id tensor by a device-to-device copy before the forward, so no host round
trip sits between the two steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.core import PLACEHOLDER_TOKEN, BatchPlan, InvalidBatchPlan


@dataclass(frozen=True)
class DeferredTokens:
    """tokens: [N_prev] int64 on the runner's device; src/dst: equal-length index tuples."""

    tokens: torch.Tensor
    src: tuple[int, ...]
    dst: tuple[int, ...]

    def check(self, plan: BatchPlan) -> None:
        """Every placeholder row of `plan` is a `dst` row and vice versa (InvalidBatchPlan)."""
        rows = [i for i, t in enumerate(plan.input_ids) if t == PLACEHOLDER_TOKEN]
        if (len(self.src) != len(self.dst) or sorted(self.dst) != rows
                or (self.src and not 0 <= min(self.src) <= max(self.src) < len(self.tokens))):
            raise InvalidBatchPlan("deferred input ids do not match the plan's placeholders",
                                   generation=plan.generation)


def check_no_placeholders(plan: BatchPlan) -> None:
    """A plan run without `DeferredTokens` must have concrete input ids only."""
    if plan.input_ids and min(plan.input_ids) < 0:
        raise InvalidBatchPlan("plan has placeholder input ids but no deferred tokens",
                               generation=plan.generation)


def _span(index: tuple[int, ...]) -> int | None:
    """Start of `index` when it is a contiguous ascending run, else None."""
    start = index[0]
    return start if index == tuple(range(start, start + len(index))) else None


def patch_input_ids(input_ids: torch.Tensor, deferred: DeferredTokens) -> None:
    """input_ids[dst[k]] = tokens[src[k]] on the device, without a host sync (a slice copy
    when both index lists are contiguous runs, the steady-state decode case)."""
    if not deferred.dst:
        return
    src, dst, n = _span(deferred.src), _span(deferred.dst), len(deferred.dst)
    if src is not None and dst is not None:
        input_ids[dst:dst + n].copy_(deferred.tokens[src:src + n])
        return
    from dataplane.h2d import to_device

    dev = input_ids.device
    values = deferred.tokens.index_select(0, to_device(list(deferred.src), torch.int64, dev))
    input_ids.index_copy_(0, to_device(list(deferred.dst), torch.int64, dev),
                          values.to(input_ids.dtype))
