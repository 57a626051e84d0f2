"""Validation jobs survive faults: real Celery worker processes on Redis, real Postgres.

- a database connection killed under the job (pg_terminate_backend) is retried;
- a worker killed with SIGKILL mid-job: a fresh worker gets the message again after the
  (short, configured) visibility timeout and finishes the artifact, and it removes the
  dead worker's scratch dir at start;
- a job whose message is gone is sent again by the reaper.

To catch a job "mid-run" deterministically the test holds the artifact's row lock from
its own connection: the job's claim waits on it, visible in pg_stat_activity.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cp_helpers import Assets, bootstrap_token, close_app, make_settings, push_dir, wait_for
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from controlplane.app import create_app

VISIBILITY_S = 3  # job_time_limit_s 2 + margin 1


@dataclass
class Stack:
    client: TestClient
    headers: dict[str, str]
    env: dict[str, str]
    tmp: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_worker(self, **env: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"worker-{len(self.workers)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "controlplane.worker.celery_app",
                 "worker", "-Q", self.env["ADAPTERPLANE_CELERY_QUEUE"], "--pool", "solo",
                 "--loglevel", "INFO", "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-n", f"faults-{len(self.workers)}-{os.getpid()}@lo"],
                env={**os.environ, **self.env, **env}, stdout=out, stderr=subprocess.STDOUT)
        self.workers.append(proc)
        wait_for(lambda: b"ready" in log.read_bytes() or proc.poll() is not None,
                 what="celery worker start")
        assert proc.poll() is None, log.read_text()
        return proc

    def log(self, index: int) -> str:
        return (self.tmp / f"worker-{index}.log").read_text()

    def push(self, assets: Assets) -> int:
        r = push_dir(self.client, self.headers, "acme", assets.h_base, assets.adapter_a)
        assert r.status_code == 202, r.text
        return int(r.json()["id"])

    def artifact(self, artifact_id: int) -> dict[str, Any]:
        body: dict[str, Any] = self.client.get(f"/v1/namespaces/acme/artifacts/{artifact_id}",
                                               headers=self.headers).json()
        return body

    def finished(self, artifact_id: int) -> dict[str, Any] | None:
        body = self.artifact(artifact_id)
        return body if body["state"] in ("validated", "rejected") else None


@pytest.fixture
def stack(pg_url: str, redis_url: str, tmp_path: Path, assets: Assets) -> Iterator[Stack]:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {
        "ADAPTERPLANE_ENVIRONMENT": "test",
        "ADAPTERPLANE_DATA_DIR": str(tmp_path / "worker-var"),
        "ADAPTERPLANE_DATABASE_URL": pg_url,
        "ADAPTERPLANE_STORAGE_URL": (tmp_path / "objects").as_uri(),
        "ADAPTERPLANE_CELERY_BROKER_URL": redis_url,
        "ADAPTERPLANE_CELERY_RESULT_BACKEND": redis_url,
        "ADAPTERPLANE_CELERY_QUEUE": f"cp-faults-{uuid.uuid4().hex[:8]}",
        "ADAPTERPLANE_MAX_RANK": "16",
        "ADAPTERPLANE_VALIDATION_RETRY_BACKOFF_S": "1",
        "ADAPTERPLANE_VALIDATION_RETRY_BACKOFF_MAX_S": "1",
        "ADAPTERPLANE_JOB_TIME_LIMIT_S": "2",
        "ADAPTERPLANE_JOB_VISIBILITY_MARGIN_S": "1",
        "ADAPTERPLANE_JOB_REAP_INTERVAL_S": "0",
        "TMPDIR": str(scratch),
    }
    settings = make_settings(
        pg_url, tmp_path / "api-var", celery_task_always_eager=False,
        celery_broker_url=redis_url, celery_result_backend=redis_url,
        celery_queue=env["ADAPTERPLANE_CELERY_QUEUE"], storage_url=env["ADAPTERPLANE_STORAGE_URL"])
    app = create_app(settings)
    headers = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    with TestClient(app) as client:
        assert client.post("/v1/bases", headers=headers,
                           json={"name": "t", "abi": assets.abi}).is_success
        assert client.post("/v1/namespaces", headers=headers, json={"name": "acme"}).is_success
        s = Stack(client, headers, env, tmp_path)
        try:
            yield s
        finally:
            for proc in s.workers:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=30)
    close_app(app)


def pg_connect(url: str) -> psycopg.Connection[Any]:
    u = make_url(url)
    return psycopg.connect(host=u.host, port=u.port, user=u.username, password=u.password,
                           dbname=u.database)


def lock_artifact(conn: psycopg.Connection[Any], artifact_id: int) -> None:
    conn.execute("SELECT id FROM artifacts WHERE id = %s FOR UPDATE", (artifact_id,))


def blocked_by(url: str, conn: psycopg.Connection[Any]) -> list[int]:
    """Backends waiting on a lock that `conn` holds."""
    with pg_connect(url) as probe:
        rows = probe.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY("
                             "pg_blocking_pids(pid))", (conn.info.backend_pid,)).fetchall()
    return [int(r[0]) for r in rows]


def test_database_fault_during_validation_is_retried(stack: Stack, assets: Assets,
                                                     pg_url: str) -> None:
    artifact_id = stack.push(assets)  # no worker yet: the message waits in Redis
    with pg_connect(pg_url) as holder:
        lock_artifact(holder, artifact_id)
        stack.start_worker()
        (job,) = wait_for(lambda: blocked_by(pg_url, holder),
                          what="the job waiting on the row lock")
        with pg_connect(pg_url) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (job,))
        # the job notes the fault and retries: it waits on the lock again
        wait_for(lambda: [p for p in blocked_by(pg_url, holder) if p != job], timeout=20,
                 what="the retried job waiting on the row lock")
        holder.rollback()
    done = wait_for(lambda: stack.finished(artifact_id), timeout=30,
                    what="validation after the database fault")
    assert done["state"] == "validated", done
    assert "OperationalError" in stack.log(0) and "Retry in 1s" in stack.log(0)


def test_killed_worker_job_is_redelivered_and_its_scratch_removed(
        stack: Stack, assets: Assets, pg_url: str) -> None:
    scratch = Path(stack.env["TMPDIR"])
    artifact_id = stack.push(assets)
    with pg_connect(pg_url) as holder:
        lock_artifact(holder, artifact_id)
        first = stack.start_worker()
        wait_for(lambda: blocked_by(pg_url, holder), what="the job waiting on the row lock")
        dead_scratch = scratch / f"adapterplane-scratch-{first.pid}"
        assert dead_scratch.is_dir()
        (dead_scratch / "adapterplane-validate-leftover").mkdir()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        holder.rollback()
    live = scratch / f"adapterplane-scratch-{os.getpid()}"  # a live process's: kept
    live.mkdir()
    second = stack.start_worker()
    assert not dead_scratch.exists()
    assert live.is_dir() and (scratch / f"adapterplane-scratch-{second.pid}").is_dir()
    done = wait_for(lambda: stack.finished(artifact_id), timeout=VISIBILITY_S + 20,
                    what="redelivery to the fresh worker")
    assert done["state"] == "validated", done
    assert "adapterplane.validate_artifact" in stack.log(1)


def test_reaper_sends_a_lost_job_again(stack: Stack, assets: Assets, pg_url: str) -> None:
    artifact_id = stack.push(assets)
    # the message is lost (the broker dropped it): delete the queue before any worker runs
    import redis

    redis.Redis.from_url(stack.env["ADAPTERPLANE_CELERY_BROKER_URL"]).delete(
        stack.env["ADAPTERPLANE_CELERY_QUEUE"])
    with pg_connect(pg_url) as conn:  # and it had been claimed once: `validating`
        conn.execute("UPDATE artifacts SET state = 'validating', validation_attempts = 1 "
                     "WHERE id = %s", (artifact_id,))
    stack.start_worker(ADAPTERPLANE_JOB_REAP_INTERVAL_S="1", ADAPTERPLANE_JOB_REAP_AFTER_S="2")
    done = wait_for(lambda: stack.finished(artifact_id), timeout=30,
                    what="validation of the reaped job")
    assert done["state"] == "validated" and done["validation_attempts"] >= 2, done
    audit = stack.client.get("/v1/audit?namespace=acme", headers=stack.headers).json()["items"]
    requeued = [e for e in audit if e["action"] == "artifact.requeued"]
    assert requeued and {(e["actor"], e["target"]) for e in requeued} == {
        ("worker:reaper", f"artifact:{artifact_id}")}


def test_reap_jobs_command_sends_a_lost_job_again(stack: Stack, assets: Assets,
                                                  pg_url: str) -> None:
    """`adapterplane reap-jobs` is one reaper pass from the command line: the lost job is
    sent again and a worker whose own reaper is off finishes it."""
    import json

    import redis

    artifact_id = stack.push(assets)
    redis.Redis.from_url(stack.env["ADAPTERPLANE_CELERY_BROKER_URL"]).delete(
        stack.env["ADAPTERPLANE_CELERY_QUEUE"])
    with pg_connect(pg_url) as conn:
        conn.execute("UPDATE artifacts SET state = 'validating', validation_attempts = 1 "
                     "WHERE id = %s", (artifact_id,))
    launcher = Path(sys.executable).parent / "adapterplane"
    run = subprocess.run([str(launcher), "reap-jobs", "--older-than-s", "0"],
                         env={**os.environ, **stack.env}, capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["artifact"] == [artifact_id]
    stack.start_worker(ADAPTERPLANE_JOB_REAP_INTERVAL_S="0")
    done = wait_for(lambda: stack.finished(artifact_id), timeout=30,
                    what="validation of the job reap-jobs sent")
    assert done["state"] == "validated", done
