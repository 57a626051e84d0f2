"""Triton kernels of the LoRA branch (imported lazily by ``get_lora_backend``)."""
