"""The LoRA expand folded into the op that consumes its projection ("hot-slot fold").

A projection whose weight carries its hot slots' LoRA ``A`` rows under its own rows,
``W_aug = [W; A_0; ...; A_{H-1}]`` (slot s: every slice's ``A`` padded to R rows, slices
in order), returns ``y_aug = x W_aug^T = [y | z]``: the shrink rode in the base GEMM and

    z[t, s*C + k*R + i] = (x A_{s,k}^T)[t, i]        C = slices * R,  every hot slot s.

The expand of each row's own slot ``s = row_slot[t]`` then runs inside the op that reads
``y`` next, with no launch of its own:

    y_k[t] <- dtype(y_k[t] + scale[s, k] * z[t, s*C + k*R : +R] @ B_k[s])   (s >= 0)

`FoldedExpand` holds ``row_slot`` (int32 [T], -1 = no adapter), ``b`` (per slice k, [H, R,
w_k] contiguous, the activation dtype) and ``scale`` (float32 [H, slices]). Rows whose
slot is -1 get no delta; R is a power of two and a lower rank is zero-padded in both ``A``
and ``B``.

The three consumers of a Llama layer: RoPE + KV write after q/k/v (`rope_and_cache`),
the residual add + RMSNorm after o and down (`fused_add_rms_norm`), SiLU·mul after
gate/up (`silu_and_mul`); each takes ``fold=`` plus the tail ``z``. The torch paths below
are the reference (and the CPU path); ops/triton/ fold the same arithmetic into the
existing kernels (fp32 delta, one rounding of ``y + delta`` to the dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.ops.errors import OpsError


@dataclass(frozen=True)
class FoldedExpand:
    row_slot: torch.Tensor
    b: tuple[torch.Tensor, ...]
    scale: torch.Tensor

    @property
    def rank(self) -> int:
        return int(self.b[0].shape[1])

    @property
    def hot_slots(self) -> int:
        return int(self.b[0].shape[0])

    @property
    def cols_per_slot(self) -> int:
        return len(self.b) * self.rank

    def check(self, tail: torch.Tensor, widths: tuple[int, ...]) -> None:
        """OpsError unless `tail` [T, >= H*C] and the factors fit `widths` (the slices)."""
        h, r = self.hot_slots, self.rank
        ok = (r > 0 and r & (r - 1) == 0 and len(widths) == len(self.b)
              and tail.dim() == 2 and tail.stride(1) == 1
              and tail.shape[1] >= h * self.cols_per_slot
              and self.row_slot.shape == (tail.shape[0],)
              and self.row_slot.dtype == torch.int32
              and self.scale.shape == (h, len(self.b)) and self.scale.dtype == torch.float32
              and all(b.shape == (h, r, w) and b.is_contiguous() and b.dtype == tail.dtype
                      for b, w in zip(self.b, widths, strict=True)))
        if not ok:
            raise OpsError("folded LoRA: tail, row_slot, B or scale do not fit the slices",
                           tail=tuple(tail.shape), widths=widths,
                           b=[tuple(b.shape) for b in self.b])


def folded_delta(tail: torch.Tensor, fold: FoldedExpand, k: int) -> torch.Tensor:
    """Reference: float32 [T, w_k], each row's expand of slice `k` (0 without a slot)."""
    r, c = fold.rank, fold.cols_per_slot
    slot = fold.row_slot.to(torch.int64)
    s = slot.clamp(min=0)
    cols = s[:, None] * c + k * r + torch.arange(r, device=tail.device)
    z = tail.gather(1, cols).float()
    delta = torch.bmm(z[:, None, :], fold.b[k][s].float())[:, 0]
    delta = delta * fold.scale[s, k][:, None]
    return torch.where(slot[:, None] >= 0, delta, torch.zeros((), device=delta.device))


def add_folded(y: torch.Tensor, tail: torch.Tensor, fold: FoldedExpand, k: int
               ) -> torch.Tensor:
    """Reference: ``dtype(y + delta_k)`` as a new tensor (y [T, w_k], any strides)."""
    return (y.float() + folded_delta(tail, fold, k)).to(y.dtype)
