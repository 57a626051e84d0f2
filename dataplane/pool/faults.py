"""Fault injection hooks for copy, validation, publication and download (off by default).

A :class:`FaultInjector` with nothing armed is inert. Arm from code
(tests) or from the environment (chaos drills on a running agent)::

    ADAPTERPLANE_FAULTS="copy=fail@2,validate=fail,publish=delay:0.5,download=fail*3"

``POINT=ACTION[:SECONDS][@PAGES][*TIMES]``: ``fail`` raises :class:`InjectedFault` at
that point; ``delay`` makes a copy event stay incomplete until waited on (and sleeps
``SECONDS`` then), or sleeps ``SECONDS`` at the other points; ``@PAGES`` lets a failing
copy write that many pages first (to overwrite victim pages before failing); ``*TIMES``
fires that many times (default 1, ``*0`` = every time).
"""

from __future__ import annotations

import enum
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from dataplane.pool.errors import InjectedFault

ENV_VAR = "ADAPTERPLANE_FAULTS"


class FaultPoint(enum.Enum):
    COPY = "copy"
    VALIDATE = "validate"
    PUBLISH = "publish"
    DOWNLOAD = "download"


class FaultAction(enum.Enum):
    FAIL = "fail"
    DELAY = "delay"


@dataclass(frozen=True)
class FaultSpec:
    action: FaultAction
    delay_s: float = 0.0
    after_pages: int = 0
    times: int = 1


_SPEC = re.compile(r"^(fail|delay)(?::([0-9.]+))?(?:@([0-9]+))?(?:\*([0-9]+))?$")


def parse_faults(text: str) -> dict[FaultPoint, FaultSpec]:
    """Parse the ``ADAPTERPLANE_FAULTS`` syntax; raises ``ValueError`` on bad input."""
    specs: dict[FaultPoint, FaultSpec] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        point, _, rest = item.partition("=")
        m = _SPEC.match(rest.strip())
        try:
            fp = FaultPoint(point.strip())
        except ValueError as exc:
            raise ValueError(f"unknown fault point {point!r}") from exc
        if m is None:
            raise ValueError(f"bad fault spec {item!r}")
        action, delay, pages, times = m.groups()
        specs[fp] = FaultSpec(FaultAction(action), float(delay or 0), int(pages or 0),
                              int(times) if times is not None else 1)
    return specs


class FaultInjector:
    """Armed faults by point; each trigger consumes one of its ``times``."""

    def __init__(self, specs: Mapping[FaultPoint, FaultSpec] | None = None) -> None:
        self._specs: dict[FaultPoint, FaultSpec] = dict(specs or {})
        self._fired: dict[FaultPoint, int] = {}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultInjector:
        env = os.environ if environ is None else environ
        return cls(parse_faults(env.get(ENV_VAR, "")))

    def arm(self, point: FaultPoint, spec: FaultSpec) -> None:
        self._specs[point] = spec
        self._fired[point] = 0

    def disarm(self, point: FaultPoint | None = None) -> None:
        if point is None:
            self._specs.clear()
        else:
            self._specs.pop(point, None)

    @property
    def armed(self) -> bool:
        return bool(self._specs)

    def take(self, point: FaultPoint) -> FaultSpec | None:
        """The spec if it fires now (consuming one trigger), else ``None``."""
        spec = self._specs.get(point)
        if spec is None:
            return None
        fired = self._fired.get(point, 0)
        if spec.times and fired >= spec.times:
            return None
        self._fired[point] = fired + 1
        return spec

    def hit(self, point: FaultPoint, **detail: object) -> None:
        """Apply a non-copy fault: raise on ``fail``, sleep on ``delay``."""
        spec = self.take(point)
        if spec is None:
            return
        if spec.action is FaultAction.FAIL:
            raise InjectedFault(f"injected {point.value} failure", point=point.value, **detail)
        if spec.delay_s:
            time.sleep(spec.delay_s)
