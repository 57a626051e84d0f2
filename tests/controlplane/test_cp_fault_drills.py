"""Fault drills: the control plane as real processes (`adapterplane api`, `adapterplane
worker` on Redis, Postgres, moto's S3) under a client that pushes and publishes in a loop,
while a drill kills or cuts one piece:

1. the API SIGKILLed mid-push/publish (at a seeded random moment, and mid-upload) and
   started again on the same database and store;
2. the worker SIGKILLed mid-validation, whole (pool children too) or one pool child;
3. Postgres refusing connections for 3 s (a TcpProxy down, then up);
4. Redis restarted (open connections dropped, then refused for 2 s);
5. S3 answering 500 for 2 s, then answering slowly.

After each drill (`fault_helpers.check_invariants`): every answer was a success, a
documented 4xx, or a retryable 502 STORAGE_ERROR / 503 DATABASE_UNAVAILABLE (never a
500); every artifact reaches `validated`/`rejected` within a deadline (retries, the
redelivery of a dead worker's message, the reaper); every 2xx push has its row and every
row's blobs verify; alias histories are gapless; every published artifact is validated;
no scratch file is left in the processes' temp dirs once they stopped.

Timings are short on purpose (`ENV`): a dead worker's message comes back after 7 s, the
reaper sends a stuck job again after 8 s.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from cp_helpers import Assets, bootstrap_token, make_settings, wait_for
from fault_helpers import Plane, S3FaultProxy, Workload, check_invariants, rows
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from controlplane.config import Settings
from controlplane.db import make_engine
from controlplane.migrate import upgrade_to_head
from controlplane.storage import ObjectStore, store_from_settings
from tests.tcp_proxy import TcpProxy

CREDS = {"ADAPTERPLANE_S3_ACCESS_KEY_ID": "test",
         "ADAPTERPLANE_S3_SECRET_ACCESS_KEY": "test-secret"}
ENV = {
    "ADAPTERPLANE_ENVIRONMENT": "test",
    "ADAPTERPLANE_MAX_RANK": "16",
    "ADAPTERPLANE_DATABASE_POOL_SIZE": "4",
    "ADAPTERPLANE_S3_MAX_ATTEMPTS": "2",
    "ADAPTERPLANE_VALIDATION_RETRY_BACKOFF_S": "1",
    "ADAPTERPLANE_VALIDATION_RETRY_BACKOFF_MAX_S": "1",
    "ADAPTERPLANE_VALIDATION_MAX_RETRIES": "4",
    "ADAPTERPLANE_JOB_TIME_LIMIT_S": "6",
    "ADAPTERPLANE_JOB_VISIBILITY_MARGIN_S": "1",
    "ADAPTERPLANE_JOB_REAP_AFTER_S": "8",
    "ADAPTERPLANE_JOB_REAP_INTERVAL_S": "2",
    **CREDS,
}


@dataclass
class Drill:
    plane: Plane
    engine: Engine
    store: ObjectStore
    pg: TcpProxy
    redis: TcpProxy
    s3: S3FaultProxy
    token: str
    assets: Assets

    def workload(self, seed: int) -> Workload:
        w = Workload(self.plane.url, self.token, self.assets.h_base, self.assets.adapter_a,
                     self.assets.adapter_big_rank, seed)
        w.start()
        return w

    def finish(self, *workloads: Workload,
               deadline_s: float = 45) -> dict[str, int]:
        """Stop the workloads, check the invariants, and that no API process left anything
        in its temp dir (a killed one's scratch root is removed by the next start)."""
        for w in workloads:
            w.stop()
        counts = check_invariants(self.engine, self.store, self.plane, list(workloads),
                                  deadline_s=deadline_s)
        assert not counts["api_leftovers"], self.plane.leftovers("api")
        return counts



def _port(url: str) -> int:
    return int(make_url(url).port or 0)


@pytest.fixture
def drill(schema_database: Any, redis_url: str, s3_endpoint: str, tmp_path: Path,
          assets: Assets) -> Iterator[Drill]:
    bucket = f"drill-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                 aws_access_key_id="test", aws_secret_access_key="test-secret",
                 ).create_bucket(Bucket=bucket)
    with schema_database("drill") as db_url, TcpProxy(_port(db_url)) as pg, \
            TcpProxy(_port(redis_url)) as redis:
        upgrade_to_head(db_url)
        s3 = S3FaultProxy(_port(s3_endpoint))
        broker = make_url(redis_url).set(port=redis.port).render_as_string()
        env = {**ENV,
               "ADAPTERPLANE_DATA_DIR": str(tmp_path / "var"),
               "ADAPTERPLANE_DATABASE_URL": make_url(db_url).set(port=pg.port)
               .render_as_string(hide_password=False),
               "ADAPTERPLANE_STORAGE_URL": f"s3://{bucket}/objects",
               "ADAPTERPLANE_S3_ENDPOINT_URL": s3.url,
               "ADAPTERPLANE_CELERY_BROKER_URL": broker,
               "ADAPTERPLANE_CELERY_RESULT_BACKEND": broker,
               "ADAPTERPLANE_CELERY_QUEUE": f"drill-{uuid.uuid4().hex[:8]}"}
        plane = Plane(tmp_path, env)
        engine = make_engine(db_url, pool_size=2)
        store = store_from_settings(Settings(
            storage_url=env["ADAPTERPLANE_STORAGE_URL"], s3_endpoint_url=s3_endpoint,
            s3_access_key_id="test", s3_secret_access_key="test-secret"))
        token = bootstrap_token(make_settings(db_url, tmp_path / "boot"))
        try:
            plane.start_api()
            plane.start_worker()
            admin = {"Authorization": f"Bearer {token}"}
            assert httpx.post(f"{plane.url}/v1/bases", headers=admin, timeout=30,
                              json={"name": "tiny", "abi": assets.abi}).is_success
            assert httpx.post(f"{plane.url}/v1/namespaces", headers=admin, timeout=30,
                              json={"name": "acme"}).is_success
            yield Drill(plane, engine, store, pg, redis, s3, token, assets)
        finally:
            plane.stop()
            s3.close()
            engine.dispose()


def validating(drill: Drill) -> list[Any]:
    return rows(drill.engine, "SELECT id FROM artifacts WHERE state = 'validating'")


# ---------------------------------------------------------------- 1. API killed


@pytest.mark.parametrize("kill_at", ["random", "mid-upload"])
def test_api_killed_mid_push_and_publish(drill: Drill, kill_at: str) -> None:
    rng = random.Random(20240611)
    w = drill.workload(seed=1)
    w.wait_answers(6)
    if kill_at == "random":
        time.sleep(rng.uniform(0.0, 1.0))
    else:  # a push is writing its blob: its temp file exists when the API dies
        drill.s3.delay_s = 0.5
        wait_for(lambda: list(drill.plane.tmpdir("api").glob(
            "adapterplane-scratch-*/adapterplane-blob-*")),
                 what="a push storing a blob", timeout=20, interval=0.01)
    drill.plane.kill(drill.plane.api)
    drill.s3.delay_s = 0.0
    time.sleep(0.3)
    drill.plane.start_api()
    w.wait_answers(8)
    counts = drill.finish(w)
    assert counts["publishes"] > 0 and any(a.status is None for a in w.answers), counts


# ---------------------------------------------------------------- 2. worker killed


@pytest.mark.parametrize("what", ["whole-worker", "pool-child"])
def test_worker_killed_during_validation(drill: Drill, what: str) -> None:
    drill.s3.delay_s = 0.3  # a validation takes ~1 s: long enough to be caught in it
    w = drill.workload(seed=2)
    scratch = drill.plane.tmpdir("worker")
    busy = wait_for(lambda: list(scratch.glob("adapterplane-scratch-*/adapterplane-validate-*")),
                    what="a validation in progress", timeout=30, interval=0.01)
    if what == "whole-worker":
        drill.plane.kill(drill.plane.worker, group=True)
        time.sleep(0.5)
        drill.plane.start_worker()
    else:
        child = int(busy[0].parent.name.rsplit("-", 1)[1])
        assert child in drill.plane.pool_children()
        import os
        import signal

        os.kill(child, signal.SIGKILL)
        wait_for(lambda: child not in drill.plane.pool_children(), what="the child reaped")
    drill.s3.delay_s = 0.0
    w.wait_answers(8)
    counts = drill.finish(w)
    assert counts["artifacts"] >= 3, counts


# ---------------------------------------------------------------- 3. Postgres refused


def test_postgres_refused_for_three_seconds(drill: Drill) -> None:
    w = drill.workload(seed=3)
    w.wait_answers(6)
    drill.pg.down()
    time.sleep(3)
    during = list(w.answers)
    drill.pg.up()
    w.wait_answers(10)
    counts = drill.finish(w)
    assert any(a.status == 503 for a in during[-5:]), during[-5:]
    assert counts["publishes"] > 0, counts


# ---------------------------------------------------------------- 4. Redis restarted


def test_redis_restarted_while_jobs_are_sent(drill: Drill) -> None:
    w = drill.workload(seed=4)
    w.wait_answers(6)
    drill.redis.reset()
    w.wait_answers(4)
    drill.redis.down()
    w.wait_answers(4)  # pushes commit; their job is sent later (reaper)
    time.sleep(2)
    drill.redis.up()
    w.wait_answers(6)
    # a consumer cut off mid-BRPOP may idle until kombu's health check (~51 s) finds it
    counts = drill.finish(w, deadline_s=60)
    assert counts["publishes"] > 0, counts


# ---------------------------------------------------------------- 5. S3 500s, slow S3


def test_s3_errors_and_slow_responses(drill: Drill) -> None:
    w = drill.workload(seed=5)
    w.wait_answers(6)
    drill.s3.failing = True
    time.sleep(2)
    drill.s3.failing = False
    drill.s3.delay_s = 0.4
    w.wait_answers(4)
    drill.s3.delay_s = 0.0
    w.wait_answers(8)
    counts = drill.finish(w)
    refused = [a for a in w.answers if a.status == 502]
    assert refused and drill.s3.failed > 0, counts
