"""Tests of the LoRA kernels (dataplane.kernels)."""
