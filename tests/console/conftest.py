"""One control plane (API + worker processes, `EmbeddedStack`) per test session for the
console tests, on a private Postgres schema, seeded once (seed.py). Tests that change
the registry use their own aliases, so tests do not depend on each other's order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from cli.stack import EmbeddedStack, free_port
from tests.console.seed import Seeded, seed


@pytest.fixture(scope="session")
def console_stack(tmp_path_factory: pytest.TempPathFactory,
                  schema_database: Callable[[str], AbstractContextManager[str]]
                  ) -> Iterator[EmbeddedStack]:
    with schema_database("console") as url:
        stack = EmbeddedStack(tmp_path_factory.mktemp("console-stack"), port=0,
                              embedded_only=True,
                              extra_env={"ADAPTERPLANE_DATABASE_URL": url,
                                         "ADAPTERPLANE_ENVIRONMENT": "test"})
        with stack:
            yield stack


@pytest.fixture(scope="session")
def seeded(console_stack: EmbeddedStack,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    registry = seed(console_stack.url, console_stack.token(),
                    tmp_path_factory.mktemp("console-assets"), free_port(), free_port())
    try:
        yield registry
    finally:
        registry.metrics_server.shutdown()
