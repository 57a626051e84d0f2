"""A real Celery worker process on Redis validates artifacts pushed (over real HTTP)
from moto's S3 server into S3 object storage.

The worker reaches S3 through a TCP relay the test can close: with the relay down,
fetches fail with a transient error and Celery retries with backoff; once it is back,
the same job finishes. Validation failures end in `rejected` after one attempt.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from cp_helpers import (
    Assets,
    LiveServer,
    bootstrap_token,
    close_app,
    make_settings,
    wait_for,
)

from controlplane.app import create_app
from controlplane.config import Settings
from tests.tcp_proxy import TcpProxy

BUCKET = "cp-worker"
CREDS = {"s3_access_key_id": "test", "s3_secret_access_key": "test-secret"}


@pytest.fixture(scope="module")
def relay(s3_endpoint: str) -> Iterator[TcpProxy]:
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                 aws_access_key_id="test", aws_secret_access_key="test-secret",
                 ).create_bucket(Bucket=BUCKET)
    with TcpProxy(int(s3_endpoint.rsplit(":", 1)[1])) as r:
        yield r


@pytest.fixture(scope="module")
def worker_env(pg_migrated: str, redis_url: str, relay: TcpProxy,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Starts `celery -A controlplane.worker.celery_app worker` on a private queue."""
    env = {
        "ADAPTERPLANE_ENVIRONMENT": "test",
        "ADAPTERPLANE_DATA_DIR": str(tmp_path_factory.mktemp("worker-var")),
        "ADAPTERPLANE_DATABASE_URL": pg_migrated,
        "ADAPTERPLANE_STORAGE_URL": f"s3://{BUCKET}/objects",
        "ADAPTERPLANE_S3_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}",
        "ADAPTERPLANE_S3_ACCESS_KEY_ID": CREDS["s3_access_key_id"],
        "ADAPTERPLANE_S3_SECRET_ACCESS_KEY": CREDS["s3_secret_access_key"],
        "ADAPTERPLANE_S3_MAX_ATTEMPTS": "1",
        "ADAPTERPLANE_CELERY_BROKER_URL": redis_url,
        "ADAPTERPLANE_CELERY_RESULT_BACKEND": redis_url,
        "ADAPTERPLANE_CELERY_QUEUE": f"cp-test-{uuid.uuid4().hex[:8]}",
        "ADAPTERPLANE_MAX_RANK": "16",
        "ADAPTERPLANE_VALIDATION_RETRY_BACKOFF_S": "1",
        "ADAPTERPLANE_VALIDATION_RETRY_BACKOFF_MAX_S": "1",
        "ADAPTERPLANE_VALIDATION_MAX_RETRIES": "100",
    }
    log = tmp_path_factory.mktemp("worker-log") / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane.worker.celery_app", "worker",
             "-Q", env["ADAPTERPLANE_CELERY_QUEUE"], "--pool", "solo", "--loglevel", "INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-n", f"cp-test-{os.getpid()}@localhost"],
            env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"ready" in log.read_bytes() or proc.poll() is not None,
                 what="celery worker start")
        assert proc.poll() is None, log.read_text()
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def api_settings(env: dict[str, str], s3_endpoint: str, tmp_path: Path) -> Settings:
    return make_settings(
        env["ADAPTERPLANE_DATABASE_URL"], tmp_path / "var", celery_task_always_eager=False,
        celery_broker_url=env["ADAPTERPLANE_CELERY_BROKER_URL"],
        celery_result_backend=env["ADAPTERPLANE_CELERY_RESULT_BACKEND"],
        celery_queue=env["ADAPTERPLANE_CELERY_QUEUE"],
        storage_url=env["ADAPTERPLANE_STORAGE_URL"], s3_endpoint_url=s3_endpoint, **CREDS)


def upload_prefix(s3_endpoint: str, adapter: Path, prefix: str) -> str:
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test-secret")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        client.upload_file(str(adapter / name), BUCKET, f"{prefix}/{name}")
    return f"s3://{BUCKET}/{prefix}"


def final_state(client: httpx.Client, artifact_id: int) -> dict[str, Any] | None:
    body: dict[str, Any] = client.get(f"/v1/namespaces/acme/artifacts/{artifact_id}").json()
    return body if body["state"] in ("validated", "rejected") else None


@pytest.fixture
def live(pg_url: str, worker_env: dict[str, str], s3_endpoint: str,
         tmp_path: Path, assets: Assets) -> Iterator[tuple[httpx.Client, Any]]:
    settings = api_settings(worker_env, s3_endpoint, tmp_path)
    app = create_app(settings)
    token = bootstrap_token(settings)
    try:
        with LiveServer(app) as server, httpx.Client(
                base_url=server.url, timeout=60,
                headers={"Authorization": f"Bearer {token}"}) as client:
            assert client.post("/v1/bases", json={"name": "t", "abi": assets.abi}).is_success
            assert client.post("/v1/namespaces", json={"name": "acme"}).is_success
            yield client, app
    finally:
        close_app(app)


def test_worker_validates_and_rejects(live: tuple[httpx.Client, Any], assets: Assets,
                                      s3_endpoint: str) -> None:
    client, app = live
    good_uri = upload_prefix(s3_endpoint, assets.adapter_a, "team/good")
    bad_uri = upload_prefix(s3_endpoint, assets.adapter_big_rank, "team/big")
    good = client.post("/v1/namespaces/acme/artifacts", json={"base": assets.h_base,
                                                               "uri": good_uri})
    bad = client.post("/v1/namespaces/acme/artifacts", json={"base": assets.h_base,
                                                              "uri": bad_uri})
    assert (good.status_code, bad.status_code) == (202, 202), (good.text, bad.text)
    ok = wait_for(lambda: final_state(client, good.json()["id"]), what="validation")
    no = wait_for(lambda: final_state(client, bad.json()["id"]), what="rejection")
    assert ok["state"] == "validated" and ok["digest"] and ok["validation_attempts"] == 1
    assert no["state"] == "rejected" and no["rejection"]["code"] == "rank_limit"
    assert no["validation_attempts"] == 1  # validation failures are never retried

    # running the job again (redelivery) leaves finished artifacts as they are
    for artifact in (ok, no):
        result = app.state.celery.send_task(
            "adapterplane.validate_artifact", args=[artifact["id"]],
            queue=app.state.jobs.queue)
        assert result.get(timeout=60, disable_sync_subtasks=False) == artifact["state"]
        again = client.get(f"/v1/namespaces/acme/artifacts/{artifact['id']}").json()
        assert again == artifact
    audit = client.get("/v1/audit?namespace=acme").json()["items"]
    assert sorted(e["action"] for e in audit if e["actor"].startswith("worker:")) == [
        "artifact.rejected", "artifact.validated"]


def test_transient_storage_error_is_retried(live: tuple[httpx.Client, Any], assets: Assets,
                                            relay: TcpProxy, s3_endpoint: str) -> None:
    client, _app = live
    uri = upload_prefix(s3_endpoint, assets.adapter_b, "team/flaky")
    relay.down()
    try:
        pushed = client.post("/v1/namespaces/acme/artifacts",
                             json={"base": assets.h_base, "uri": uri})
        assert pushed.status_code == 202, pushed.text
        art_id = pushed.json()["id"]

        def retried_after_failure() -> bool:
            a = client.get(f"/v1/namespaces/acme/artifacts/{art_id}").json()
            return a["validation_attempts"] >= 2 and a["state"] == "validating"

        wait_for(retried_after_failure, what="a retry after a failed attempt")
        during = client.get(f"/v1/namespaces/acme/artifacts/{art_id}").json()
        assert "TransientStorageError" in during["last_error"]
    finally:
        relay.up()
    done = wait_for(lambda: final_state(client, art_id), what="validation after recovery")
    # attempt 1 failed transiently (last_error above); a retry then succeeded
    assert done["state"] == "validated" and done["validation_attempts"] >= 2
    assert done["rejection"] is None


def test_embedded_default_worker_on_sqlite_broker(tmp_path: Path, assets: Assets) -> None:
    """The embedded default: SQLite registry, file storage, `sqla+sqlite` broker and
    `db+sqlite` results, everything derived from one data_dir; a real worker process."""
    from controlplane.migrate import upgrade_to_head

    data_dir = tmp_path / "var"
    env = {"ADAPTERPLANE_DATA_DIR": str(data_dir), "ADAPTERPLANE_MAX_RANK": "16",
           "ADAPTERPLANE_ENVIRONMENT": "development"}
    settings = Settings(data_dir=data_dir, max_rank=16)
    assert settings.celery_broker_url.startswith("sqla+sqlite:///")
    upgrade_to_head(settings.database_url)
    log = tmp_path / "worker.log"
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERPLANE_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane.worker.celery_app", "worker",
             "-Q", settings.celery_queue, "--pool", "solo", "--loglevel", "INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-n", f"cp-embedded-{os.getpid()}@localhost"],
            env={**clean_env, **env}, stdout=out, stderr=subprocess.STDOUT)
    app = create_app(settings)
    try:
        wait_for(lambda: b"ready" in log.read_bytes() or proc.poll() is not None,
                 what="celery worker start")
        assert proc.poll() is None, log.read_text()
        headers = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
        with LiveServer(app) as server, httpx.Client(base_url=server.url, headers=headers,
                                                     timeout=60) as client:
            client.post("/v1/bases", json={"name": "t", "abi": assets.abi})
            client.post("/v1/namespaces", json={"name": "acme"})
            files = {n: (n, (assets.adapter_a / n).read_bytes())
                     for n in ("adapter_config.json", "adapter_model.safetensors")}
            pushed = client.post("/v1/namespaces/acme/artifacts", data={"base": assets.h_base},
                                 files=files)
            assert pushed.status_code == 202, pushed.text
            done = wait_for(lambda: final_state(client, pushed.json()["id"]),
                            what="validation on the embedded stack")
            assert done["state"] == "validated", (done, log.read_text())
    finally:
        close_app(app)
        proc.terminate()
        proc.wait(timeout=30)


def test_worker_fits_a_collection_from_s3(live: tuple[httpx.Client, Any], assets: Assets,
                                          s3_endpoint: str) -> None:
    """A real worker fetches both members from S3, fits, and stores the bundle in S3."""
    client, app = live
    ids = []
    for name, adapter in (("ca", assets.adapter_a), ("cb", assets.adapter_b)):
        uri = upload_prefix(s3_endpoint, adapter, f"team/{name}")
        pushed = client.post("/v1/namespaces/acme/artifacts",
                             json={"base": assets.h_base, "uri": uri})
        assert pushed.status_code in (200, 202), pushed.text
        ok = wait_for(lambda i=pushed.json()["id"]: final_state(client, i), what="validation")
        assert ok["state"] == "validated"
        ids.append(ok["id"])
    submitted = client.post("/v1/namespaces/acme/collections", json={
        "name": "pair", "base": assets.h_base, "sources": ids, "rank": 12,
        "max_relative_error": "1/10000"})
    assert submitted.status_code == 202, submitted.text
    url = f"/v1/namespaces/acme/collections/{submitted.json()['id']}"
    done = wait_for(lambda: (lambda b: b if b["state"] in ("fitted", "rejected") else None)(
        client.get(url).json()), what="collection fit")
    assert done["state"] == "fitted", done
    assert done["fit_attempts"] == 1 and done["metrics"]["max_relative_error"] < 1e-4
    # a redelivered job leaves the fitted collection as it is
    again = app.state.celery.send_task("adapterplane.fit_collection", args=[done["id"]],
                                       queue=app.state.jobs.queue)
    assert again.get(timeout=60, disable_sync_subtasks=False) == "fitted"
    assert client.get(url).json() == done
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test-secret")
    for blob in done["files"].values():
        head = s3.head_object(Bucket=BUCKET, Key=f"objects/{blob['key']}")
        assert head["ContentLength"] == blob["size"]
