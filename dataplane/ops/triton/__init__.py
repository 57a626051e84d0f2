"""Triton kernels of the fused ops with their checked launchers (imported lazily by
dataplane.ops, so the torch paths never import Triton)."""
