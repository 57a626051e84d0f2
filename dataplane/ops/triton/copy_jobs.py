# mypy: disable-error-code="no-untyped-def"
"""Many device-to-device copies in one launch: a job table of (source, destination,
length) in 4-byte words, as offsets from one base tensor's address.

The LoRA fold copies each adapter it lacks in from every projection's factor table
(dataplane/layers/lora_fold_slots.py): a few hundred blocks of 4 B to 230 KB per adapter,
which as torch copies cost a host launch each (18–25 ms for 64 adapters of an 8B model at
TP=2). Here one program per job copies its words in `BLOCK`-word chunks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _copy_jobs_kernel(base_ptr, jobs_ptr, BLOCK: tl.constexpr):
    job = tl.program_id(0).to(tl.int64)
    src = tl.load(jobs_ptr + 3 * job)
    dst = tl.load(jobs_ptr + 3 * job + 1)
    n = tl.load(jobs_ptr + 3 * job + 2)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        mask = offs < n
        tl.store(base_ptr + dst + offs, tl.load(base_ptr + src + offs, mask=mask), mask=mask)


def copy_jobs(base: torch.Tensor, jobs: torch.Tensor) -> None:
    """Run `jobs` (int64 ``[J, 3]`` on `base`'s device: source and destination offsets
    from ``base.data_ptr()``, and lengths, all in 4-byte words) in one launch. `base`: an
    int32 tensor; the caller guarantees every range lies inside a live tensor on its
    device and that no destination overlaps a source."""
    if base.dtype != torch.int32 or jobs.dtype != torch.int64 or jobs.dim() != 2 \
            or jobs.shape[1] != 3 or jobs.device != base.device:
        raise ValueError("copy_jobs needs an int32 base and int64 [J, 3] jobs on its device")
    if jobs.shape[0]:
        _copy_jobs_kernel[(jobs.shape[0],)](base, jobs, BLOCK=BLOCK)
