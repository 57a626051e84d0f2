"""The result of validation: an artifact's identity plus the sizes the system plans with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dataplane.artifacts.errors import ArtifactRejected, RejectionCode
from dataplane.identity import (
    ArtifactIdentity,
    IdentityError,
    JSONValue,
    ModuleSpec,
    activation_policy_sha256,
    h_adapter_semantic,
)

ALORA_KEY = "alora_invocation_tokens"


@dataclass(frozen=True)
class ValidatedArtifact:
    """A validated LoRA artifact. Invariants: `modules` strictly sorted by name;
    `h_artifact == ArtifactIdentity(method, peft_config_sha256, h_base, modules).h_artifact`;
    `total_params = sum(r * (d_in + d_out))`; `total_bytes` = factor payload bytes.
    `target_modules` are the distinct roles adapted ("q_proj", ...), sorted.
    `invocation_tokens`: an activated LoRA's invocation token ids (None: always on); they
    are part of the PEFT config digest and so of `h_artifact`, and decide the activation
    policy digest of the semantic identity."""

    h_artifact: str
    method: str
    peft_config_sha256: str
    h_base: str
    modules: tuple[ModuleSpec, ...]
    target_modules: tuple[str, ...]
    total_params: int
    total_bytes: int
    dtype: str
    invocation_tokens: tuple[int, ...] | None = None

    @classmethod
    def from_identity(cls, identity: ArtifactIdentity,
                      invocation_tokens: tuple[int, ...] | None = None) -> ValidatedArtifact:
        modules = identity.modules
        return cls(
            h_artifact=identity.h_artifact, method=identity.method,
            peft_config_sha256=identity.peft_config_sha256, h_base=identity.h_base,
            modules=modules, target_modules=tuple(sorted({m.role for m in modules})),
            total_params=sum(m.scalars for m in modules),
            total_bytes=sum(m.nbytes for m in modules),
            dtype=modules[0].dtype, invocation_tokens=invocation_tokens,
        )

    @property
    def identity(self) -> ArtifactIdentity:
        return ArtifactIdentity(self.method, self.peft_config_sha256, self.h_base, self.modules)

    @property
    def max_rank(self) -> int:
        return max(m.rank for m in self.modules)

    @property
    def activation_policy_sha256(self) -> str:
        return activation_policy_sha256(self.invocation_tokens)

    @property
    def h_adapter_semantic(self) -> str:
        """The base-plus-adapter function served: H_base, H_artifact, activation policy."""
        return h_adapter_semantic(self.h_base, self.h_artifact, self.activation_policy_sha256)

    def to_record(self) -> dict[str, JSONValue]:
        record: dict[str, JSONValue] = {
            "h_artifact": self.h_artifact, "method": self.method,
            "peft_config_sha256": self.peft_config_sha256, "h_base": self.h_base,
            "modules": [m.to_record() for m in self.modules],
            "target_modules": list(self.target_modules), "total_params": self.total_params,
            "total_bytes": self.total_bytes, "dtype": self.dtype,
        }
        if self.invocation_tokens is not None:  # plain LoRA records carry no such key
            record[ALORA_KEY] = list(self.invocation_tokens)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ValidatedArtifact:
        """Rebuild from to_record(), re-deriving every digest and total; raise on drift."""
        try:
            identity = ArtifactIdentity(
                str(record["method"]), record["peft_config_sha256"], record["h_base"],
                tuple(ModuleSpec.from_record(m) for m in record["modules"]))
            tokens = record.get(ALORA_KEY)
            invocation = None if tokens is None else tuple(int(t) for t in tokens)
            activation_policy_sha256(invocation)  # a well-formed policy
        except (KeyError, TypeError, ValueError, IdentityError) as exc:
            raise ArtifactRejected(RejectionCode.INCONSISTENT_RECORD,
                                   f"malformed artifact record ({exc!r})") from exc
        artifact = cls.from_identity(identity, invocation)
        if artifact.to_record() != dict(record):
            raise ArtifactRejected(RejectionCode.INCONSISTENT_RECORD,
                                   "artifact record does not re-derive from its modules",
                                   {"h_artifact": artifact.h_artifact})
        return artifact
