"""Launch a Triton kernel through its compiled kernel, skipping ``JITFunction.run``.

``kernel[grid](*args, **constexprs)`` binds and specializes every argument, hashes a cache
key, looks up the device and stream and only then launches: that costs tens of µs of host
time per launch, and an eager 8B step makes 256 LoRA launches, so the host, not the
device, would bound an eager mixed step. A `LaunchPlan` is built once per static launch
shape (constexpr values, compile options, the specialized integer arguments); it keeps the
compiled kernels Triton chose, keyed by what else Triton specializes on (the device, each
tensor's dtype and 16-byte alignment), and launches them on the current stream with the
arguments in parameter order.
The first launch for a key goes through ``kernel[grid]`` itself (so Triton compiles,
caches and launches as usual); under ``TRITON_INTERPRET=1`` (CPU tests) or with
``ADAPTERPLANE_TRITON_FAST_LAUNCH=0`` every launch does.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import torch
import triton

_ALIGN = 16  # Triton specializes pointer arguments on 16-byte alignment


@functools.cache
def enabled() -> bool:
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    fast = os.environ.get("ADAPTERPLANE_TRITON_FAST_LAUNCH", "1") not in ("", "0")
    return fast and not interp and hasattr(triton, "knobs")


def tensor_key(args: Sequence[Any], positions: Sequence[int]) -> tuple[Any, ...]:
    """What Triton specializes on beyond the plan: the dtype of each tensor argument (at
    ``positions``) and whether its address is 16-byte aligned."""
    return tuple((args[i].dtype, args[i].data_ptr() % _ALIGN == 0) for i in positions)


class LaunchPlan:
    """One launch shape of ``fn``: ``constexprs`` holds every constexpr parameter by
    name, plus compile options such as ``num_warps``. A plan serves one value of every
    specialized integer argument (callers key their plan caches on them); integers in
    ``fn.do_not_specialize`` and the grid may vary per call."""

    def __init__(self, fn: Any, constexprs: dict[str, Any]) -> None:
        self.fn = fn
        self.constexprs = constexprs
        self.kernels: dict[tuple[Any, ...], Any] = {}
        self.num_runtime, self.tail = -1, ()
        self.tensors: tuple[int, ...] | None = None  # positions of the tensor arguments
        if not enabled():  # under the interpreter `fn` has no parameter objects
            return
        names = list(fn.arg_names)
        consts = [p.is_constexpr for p in fn.params]
        first = consts.index(True) if True in consts else len(names)
        if not all(consts[first:]):
            raise TypeError(f"{fn.__name__}: constexpr parameters must come last")
        self.num_runtime = first
        self.tail = tuple(constexprs[n] for n in names[first:])

    def __call__(self, grid: tuple[int, ...], *args: Any) -> None:
        if not enabled():
            self.fn[grid](*args, **self.constexprs)
            return
        if len(args) != self.num_runtime:
            raise TypeError(f"{self.fn.__name__}: {self.num_runtime} runtime arguments, "
                            f"got {len(args)}")
        if self.tensors is None:  # callers pass tensors at fixed positions
            self.tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        driver = triton.runtime.driver.active
        device = driver.get_current_device()
        key = (device, *tensor_key(args, self.tensors))
        kernel = self.kernels.get(key)
        if kernel is None:  # Triton binds, compiles (or finds) and launches this once
            self.kernels[key] = self.fn[grid](*args, **self.constexprs)
            return
        values = (*args, *self.tail)
        stream = driver.get_current_stream(device)
        runtime = triton.knobs.runtime
        g0, g1, g2 = (*grid, 1, 1)[:3]
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata,
                   kernel.launch_metadata(grid, stream, *values),
                   runtime.launch_enter_hook, runtime.launch_exit_hook, *values)


_PLANS: dict[tuple[Any, ...], LaunchPlan] = {}
_MAX_PLANS = 4096


def cached_plan(fn: Any, key: tuple[Any, ...], constexprs: dict[str, Any]) -> LaunchPlan:
    """The `LaunchPlan` of ``fn`` for ``key``, made once. ``key`` must hold every value the
    plan depends on: each specialized integer argument and each entry of ``constexprs``
    (launchers build it from the same values they pass)."""
    full = (fn, key)
    plan = _PLANS.get(full)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[full] = LaunchPlan(fn, constexprs)
    return plan


@functools.cache
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (``device.index`` None: the current one)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(index).multi_processor_count)

