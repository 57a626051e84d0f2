"""Catalog bodies: publish/retire/rollback requests, the alias PATCH (hot mark),
generations, resolutions."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlplane.artifacts.schemas import ArtifactSummary

ALIAS_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?$"


class CasFields(BaseModel):
    expected_generation: int | None = Field(
        default=None, ge=0, strict=True,
        description="Compare-and-swap: the alias's current generation (0: never published). "
                    "Mismatch -> 409 GENERATION_CONFLICT. Null: append after whatever is current.")
    reason: str | None = Field(default=None, max_length=2000)


class PublishRequest(CasFields):
    """Exactly one target: an adapter (`artifact`) or a merged release (`release`)."""

    artifact: str | None = Field(default=None, description="Artifact id, or "
                                 "`sha256:<H_artifact>`: the alias serves this adapter.")
    release: str | None = Field(default=None, description="Merge id, or `sha256:<H_merged>`: "
                                "the alias serves this merged release (a base of its own, "
                                "made from the alias's base) with no adapter.")

    @model_validator(mode="after")
    def _one_target(self) -> PublishRequest:
        if (self.artifact is None) == (self.release is None):
            raise ValueError("give exactly one of artifact and release")
        return self


class RetireRequest(CasFields):
    pass


class RollbackRequest(CasFields):
    to_generation: int | None = Field(
        default=None, ge=1, strict=True,
        description="Generation whose target (artifact or release) to restore; default: the "
                    "newest earlier generation that pointed at a different target than the "
                    "current state.")


class AliasPatch(BaseModel):
    """Body of `PATCH /v1/namespaces/{ns}/aliases/{alias}`: the alias's hot mark."""

    model_config = ConfigDict(extra="forbid")

    hot: bool = Field(strict=True, description="Prefetch the alias's current artifact on "
                      "every compatible agent with room (true), or leave it to placement's "
                      "usual rules (false).")


class ReleaseSummary(BaseModel):
    """The merged release a generation serves."""

    id: int = Field(description="The merge id.")
    name: str
    digest: str = Field(description="H_merged.")
    base: str = Field(description="H_base of the merged checkpoint: agents of this base "
                      "serve the alias.")


class GenerationOut(BaseModel):
    namespace: str
    alias: str
    generation: int
    action: Literal["publish", "retire", "rollback"]
    artifact: ArtifactSummary | None
    release: ReleaseSummary | None = Field(
        default=None, description="Set instead of `artifact` when the generation serves a "
                                  "merged release; both null: a retire.")
    actor: str
    reason: str | None
    created_at: datetime


class ResolutionOut(GenerationOut):
    base: str = Field(description="H_base of the alias (its adapters' base; a release's "
                      "own base is `release.base`).")
    hot: bool = Field(default=False, description="Marked hot: placement prefetches the "
                      "current artifact on every compatible agent with room.")
