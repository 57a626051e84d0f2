"""What the engine loop is handed and what it hands back: a :class:`Ticket` per admitted
request, and the :data:`Event` objects its sink receives.

Events: :class:`~dataplane.engine.engine.RequestOutput` objects, then nothing more once
one is `finished`, or one :class:`~agent.catalog.ServingError` (the two below are the
loop's own).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.catalog import Generation, ServingError
from dataplane.core import SamplingParams
from dataplane.engine.engine import RequestOutput

Event = RequestOutput | ServingError


class InternalError(ServingError):
    status, code = 500, "ENGINE_ERROR"


class BadPrompt(ServingError):
    status, code = 422, "VALIDATION_ERROR"


class BadResponseFormat(ServingError):
    """`response_format` malformed, or a schema the grammar compiler refuses."""

    status, code = 422, "INVALID_RESPONSE_FORMAT"


class UnsupportedParameter(ServingError):
    """A request field the agent does not honour yet, set to a value that would matter
    (agent/openai_schemas.py `UNSUPPORTED`); `detail.param` names it."""

    status, code = 422, "UNSUPPORTED_PARAMETER"


class NotInvoked(ServingError):
    """The model is an activated LoRA and the prompt lacks its invocation tokens (the
    request may ask for the base model instead: `alora_base_if_not_invoked`)."""

    status, code = 422, "ALORA_NOT_INVOKED"


@dataclass
class Ticket:
    """One admitted request; `generation` None = base model."""

    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    generation: Generation | None
    sink: Callable[[Event], None]
    created: float = field(default_factory=time.monotonic)
    residency: str = "base"
    last_token_at: float | None = None
    max_queue_s: float | None = None
    """Seconds from `created` within which the request must start (None: no limit)."""
    base_if_not_invoked: bool = False
    """On an activated LoRA whose invocation the prompt lacks: the base model, not 422."""
    prefill_after: str | None = None
    """Another ticket with the same prompt whose prefill this one waits for (n > 1)."""

    @property
    def tenant(self) -> str:
        """The engine scheduler's tenant: the namespace of the alias the request named
        ("" for the base model)."""
        return self.generation.namespace if self.generation is not None else ""
