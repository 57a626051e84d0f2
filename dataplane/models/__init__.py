"""Llama-family decoders (Llama, Mistral, Qwen2) loaded from local HF safetensors."""

from __future__ import annotations

from dataplane.models.config import ModelConfig, RopeConfig
from dataplane.models.errors import ModelLoadError, UnsupportedModel
from dataplane.models.llama import LlamaForCausalLM
from dataplane.models.loader import init_random, load_model

__all__ = ["LlamaForCausalLM", "ModelConfig", "ModelLoadError", "RopeConfig",
           "UnsupportedModel", "init_random", "load_model"]
