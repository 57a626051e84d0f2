"""Enqueue-after-commit (jobs leave only with a commit, never with a rollback) and the
artifact row's guards (state machine, immutable and write-once columns)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from controlplane.db import make_engine, make_session_factory
from controlplane.models import (
    Artifact,
    ArtifactState,
    ArtifactStateError,
    BaseModel,
    Namespace,
)
from controlplane.worker.jobs import JobQueue


@pytest.fixture
def session_factory(database_url: str) -> Any:
    engine = make_engine(database_url, pool_size=2)
    yield make_session_factory(engine)
    engine.dispose()


def recording_queue() -> tuple[JobQueue, list[Any], str]:
    """A real Celery app in eager mode whose task records its arguments."""
    app = Celery("jobs-test", broker="memory://", backend="cache+memory://")
    app.conf.task_always_eager = True
    sent: list[Any] = []
    name = f"test.record.{uuid.uuid4().hex}"

    @app.task(name=name)
    def record(value: Any) -> None:
        sent.append(value)

    return JobQueue(app, "q"), sent, name


def test_jobs_are_sent_only_after_commit(session_factory: Any) -> None:
    jobs, sent, task = recording_queue()
    with session_factory() as session:
        session.add(Namespace(name="n1"))
        jobs.enqueue(session, task, 1)
        assert sent == []
        session.rollback()
        assert sent == []
        session.add(Namespace(name="n2"))
        jobs.enqueue(session, task, 2)
        with session.begin_nested():  # a savepoint that commits keeps the job
            jobs.enqueue(session, task, 3)
        savepoint = session.begin_nested()
        savepoint.rollback()  # a rolled-back savepoint does not drop the outer jobs
        session.commit()
        assert sent == [2, 3]
        session.commit()
        assert sent == [2, 3]  # sent once


def make_artifact(session: Any) -> Artifact:
    ns = Namespace(name="guards")
    base = BaseModel(h_base="b" * 64, name="b", architecture=None, abi={})
    session.add_all([ns, base])
    session.flush()
    artifact = Artifact(namespace_id=ns.id, base_id=base.id, upload_sha256="u" * 64,
                        storage_key="blobs/sha256/x", files={}, size_bytes=1, created_by="t",
                        state="pending", validation_attempts=0)
    session.add(artifact)
    session.commit()
    return artifact


def test_artifact_guards(session_factory: Any) -> None:
    with session_factory() as session:
        art = make_artifact(session)
        with pytest.raises(ArtifactStateError):
            art.transition(ArtifactState.VALIDATED)  # pending -> validated skips a step
        art.state = "validated"  # bypassing transition() is caught on flush
        with pytest.raises(ArtifactStateError):
            session.flush()
        session.rollback()

        art.storage_key = "blobs/sha256/other"
        with pytest.raises(ArtifactStateError):
            session.flush()
        session.rollback()

        art.transition(ArtifactState.VALIDATING)
        session.flush()  # the flush guard checks one transition per flush
        art.transition(ArtifactState.VALIDATED)
        art.digest = "d" * 64
        session.commit()
        art.digest = "e" * 64
        with pytest.raises(ArtifactStateError):
            session.flush()
        session.rollback()
        with pytest.raises(ArtifactStateError):
            art.transition(ArtifactState.REJECTED)
        stored = session.scalars(select(Artifact.state)).one()
        assert stored == "validated"
