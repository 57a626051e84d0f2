"""PEFT artifact reading and validation, without torch.

    from dataplane.artifacts import read_base_abi, validate_peft_dir, ArtifactRejected

    base = read_base_abi(Path("models/smollm2"))          # headers + streamed sha256 only
    try:
        artifact = validate_peft_dir(Path("adapters/a1"), base, ArtifactLimits(max_rank=64))
    except ArtifactRejected as exc:
        print(exc.code, exc.message, exc.detail)          # exc.code: RejectionCode (StrEnum)
    artifact.h_artifact, artifact.modules, artifact.to_record()

Identity records (ModuleSpec, digests) come from dataplane.identity and are re-exported.
"""

from __future__ import annotations

from pathlib import Path

from dataplane.artifacts.base_abi import BaseModelABI, read_base_abi
from dataplane.artifacts.errors import ArtifactRejected, RejectionCode
from dataplane.artifacts.json_files import read_json_object
from dataplane.artifacts.peft_config import LoraSettings, parse_lora_config
from dataplane.artifacts.validated import ValidatedArtifact
from dataplane.artifacts.validation import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ArtifactLimits,
    canonical_module_name,
    validate_peft_dir,
)
from dataplane.identity import SCALING_ALPHA_OVER_R, SCALING_RSLORA, ModuleSpec


def read_adapter_config(adapter_dir: Path) -> LoraSettings:
    """Parse and check `adapter_dir/adapter_config.json` (no tensors read)."""
    return parse_lora_config(read_json_object(Path(adapter_dir) / CONFIG_FILE,
                                              what="adapter config"))


__all__ = [
    "CONFIG_FILE",
    "SCALING_ALPHA_OVER_R",
    "SCALING_RSLORA",
    "WEIGHTS_FILE",
    "ArtifactLimits",
    "ArtifactRejected",
    "BaseModelABI",
    "LoraSettings",
    "ModuleSpec",
    "RejectionCode",
    "ValidatedArtifact",
    "canonical_module_name",
    "parse_lora_config",
    "read_adapter_config",
    "read_base_abi",
    "validate_peft_dir",
]
