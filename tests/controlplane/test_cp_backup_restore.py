"""Backup and restore (`adapterplane backup` / `restore`, controlplane/backup): a backup
restored into a fresh database and a fresh bucket serves the same catalog, history,
artifacts and audit log, entry for entry, and a fresh agent on it reconciles to the
residency the original agent had. Refusals (a non-empty target, a damaged backup) change
nothing.

Postgres + S3: a real stack (`cli.stack.EmbeddedStack`: API and Celery worker processes)
on a database of its own, objects on the moto S3 server, one CPU agent process. The
reference for "identical" is the source stack's own REST answers, read before the backup.
SQLite + file://: the embedded default, in-process API, the commands as subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_helpers import (
    Api,
    Assets,
    bootstrap_token,
    close_app,
    make_settings,
    push_dir,
    setup_namespace,
)
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import make_url

from controlplane.app import create_app
from controlplane.db import make_engine
from controlplane.migrate import upgrade_to_head
from dataplane.artifacts import read_base_abi
from dataplane.assets import make_peft_adapter, make_tiny_llama
from tests.agent.assets import write_byte_tokenizer
from tests.agent.stack import Admin, AgentProcess

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

S3_KEY = "testing"
LAUNCHER = [sys.executable, "-m", "cli.launcher"]


# ---------------------------------------------------------------- helpers


def adapterplane(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The `adapterplane` command with `env` as its only store settings."""
    from cli.stack import STORE_ENV_VARS

    inherited = {k: v for k, v in os.environ.items() if k not in STORE_ENV_VARS}
    return subprocess.run([*LAUNCHER, *args], env={**inherited, **env}, capture_output=True,
                          text=True, check=False, timeout=120)


@contextmanager
def fresh_database(postgres_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database (created by the `postgres` superuser, owned by the test role),
    dropped on exit."""
    url = make_url(postgres_url)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"

    def psql(sql: str) -> None:
        subprocess.run(["psql", "-h", url.host or "127.0.0.1", "-p", str(url.port or 5432),
                        "-U", "postgres", "-d", "postgres", "-q", "-v", "ON_ERROR_STOP=1",
                        "-c", sql], check=True, capture_output=True)

    psql(f'CREATE DATABASE "{name}" OWNER "{url.username}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def relations(database_url: str) -> dict[str, int]:
    """Row count of every table in `public` (an empty database: {})."""
    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            names = conn.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars()
            return {n: int(conn.execute(text(f'SELECT count(*) FROM "{n}"')).scalar_one())
                    for n in sorted(names)}
    finally:
        engine.dispose()


def pages(http: Any, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = ""
    while True:
        r = http.get(path, params={"limit": 500, "cursor": cursor})
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text}"
        body = r.json()
        items += body["items"]
        if not body["next_cursor"]:
            return items
        cursor = body["next_cursor"]


def catalog_view(http: Any) -> dict[str, Any]:
    """Everything an admin can read about the catalog: bases, namespaces, every alias's
    resolution and full generation history, artifacts, collections and the audit log."""
    view: dict[str, Any] = {"bases": pages(http, "/v1/bases"),
                            "namespaces": pages(http, "/v1/namespaces"),
                            "audit": pages(http, "/v1/audit")}
    for ns in (n["name"] for n in view["namespaces"]):
        aliases = pages(http, f"/v1/namespaces/{ns}/aliases")
        view[f"{ns}/aliases"] = aliases
        for alias in (a["alias"] for a in aliases):
            view[f"{ns}/{alias}/history"] = pages(
                http, f"/v1/namespaces/{ns}/aliases/{alias}/history")
        view[f"{ns}/artifacts"] = pages(http, f"/v1/namespaces/{ns}/artifacts")
        view[f"{ns}/collections"] = pages(http, f"/v1/namespaces/{ns}/collections")
    return view


def referenced_keys(view: dict[str, Any]) -> set[str]:
    """Blob keys the catalog names, read from the REST view (the expected backup content)."""
    keys: set[str] = set()
    for name, items in view.items():
        if name.endswith("/artifacts") or name.endswith("/collections"):
            for item in items:
                if item.get("storage_key"):
                    keys.add(item["storage_key"])
                keys |= {f["key"] for f in (item.get("files") or {}).values()}
    return keys


def residency(agent: AgentProcess, token: str) -> dict[str, Any]:
    """What the agent serves: each alias's bound generation and artifact, and the set of
    artifact digests resident in its slots."""
    models = httpx.get(f"{agent.url}/v1/models", timeout=5.0,
                       headers={"Authorization": f"Bearer {token}"}).json()["data"]
    bindings = {m["id"]: (m["adapterplane"]["generation"], m["adapterplane"]["artifact_digest"])
                for m in models if "adapterplane" in m}
    slots = sorted(s["artifact_digest"] for s in agent.state()["slots"]
                   if s["state"] in ("active", "idle"))
    return {"bindings": bindings, "resident": slots}


# ---------------------------------------------------------------- Postgres + S3 stack


@dataclass
class Source:
    """The populated source stack's REST view and residency, and its backup directory."""

    view: dict[str, Any]
    residency: dict[str, Any]
    backup: Path
    manifest: dict[str, Any]
    admin_token: str
    reader_token: str
    revoked_token: str
    agent_token: str
    s3: Any
    model_dir: Path
    expected_resident: list[str]


def s3_env(endpoint: str, bucket: str) -> dict[str, str]:
    return {"ADAPTERPLANE_STORAGE_URL": f"s3://{bucket}/objects",
            "ADAPTERPLANE_S3_ENDPOINT_URL": endpoint,
            "ADAPTERPLANE_S3_ACCESS_KEY_ID": S3_KEY,
            "ADAPTERPLANE_S3_SECRET_ACCESS_KEY": S3_KEY,
            "ADAPTERPLANE_ENVIRONMENT": "test"}


def new_bucket(s3: Any) -> str:
    bucket = f"backup-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    return bucket


def bucket_keys(s3: Any, bucket: str) -> list[str]:
    listing = s3.list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def agent_env(url: str, token: str, model_dir: Path, work: Path) -> dict[str, str]:
    return {"ADAPTERPLANE_AGENT_CONTROL_PLANE_URL": url,
            "ADAPTERPLANE_AGENT_TOKEN": token,
            "ADAPTERPLANE_AGENT_NAME": "agent-0",
            "ADAPTERPLANE_AGENT_MODEL_DIR": str(model_dir),
            "ADAPTERPLANE_AGENT_CACHE_DIR": str(work / "cache"),
            "ADAPTERPLANE_AGENT_MAX_RANK": "8",
            "ADAPTERPLANE_AGENT_MAX_SLOTS": "4",
            "ADAPTERPLANE_AGENT_NUM_KV_BLOCKS": "128",
            "ADAPTERPLANE_AGENT_LONG_POLL_S": "5",
            "ADAPTERPLANE_AGENT_HEARTBEAT_INTERVAL_S": "0.5"}


@pytest.fixture(scope="module")
def s3(s3_endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                        aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, postgres_url: str, s3_endpoint: str,
           s3: Any) -> Iterator[Source]:
    """A stack with two namespaces, three aliases (one with publish, publish, rollback; one
    hot), a reader token, a revoked token, an agent; backed up while it runs."""
    from cli.stack import EmbeddedStack

    root = tmp_path_factory.mktemp("backup-source")
    base = make_tiny_llama(root / "base", seed=7)
    write_byte_tokenizer(base)
    adapters = {name: make_peft_adapter(base, root / name, seed=seed, rank=rank, alpha=8,
                                        target_modules=["q_proj", "v_proj"])
                for name, seed, rank in (("a", 1, 4), ("b", 2, 8), ("c", 3, 2))}
    env = {**s3_env(s3_endpoint, new_bucket(s3))}
    with fresh_database(postgres_url, "backup_src") as database_url:
        env["ADAPTERPLANE_DATABASE_URL"] = database_url
        with EmbeddedStack(root / "cp", port=0, embedded_only=True, extra_env=env) as stack:
            admin = Admin(stack.url, stack.token())
            h_base = str(admin.call("POST", "/v1/bases", json={
                "name": "tiny", "abi": read_base_abi(base).to_record()})["h_base"])
            for ns in ("acme", "beta"):
                admin.call("POST", "/v1/namespaces", json={"name": ns})
            art = {n: admin.push("acme", h_base, p) for n, p in adapters.items()}
            beta_b = admin.push("beta", h_base, adapters["b"])
            assert admin.publish("acme", "support", art["a"]["id"]) == 1
            assert admin.publish("acme", "support", art["b"]["id"]) == 2
            assert admin.rollback("acme", "support") == 3
            admin.publish("acme", "chat", art["c"]["id"])
            admin.publish("beta", "x", beta_b["id"])
            admin.call("PATCH", "/v1/namespaces/acme/aliases/chat", json={"hot": True})
            reader = admin.token("reader", [{"namespace": "acme", "role": "read"}])
            revoked = admin.http.post("/v1/tokens", json={"name": "gone", "grants": [
                {"namespace": "acme", "role": "read"}]}).json()
            admin.call("DELETE", f"/v1/tokens/{revoked['id']}")
            agent_token = admin.token("agent-0", [], is_agent=True)

            # support is back on a (the rollback), chat on c, beta/x on b
            expected = sorted({art["a"]["digest"], art["b"]["digest"], art["c"]["digest"]})
            agent = AgentProcess(root / "agent.log",
                                 agent_env(stack.url, agent_token, base, root / "agent"))
            agent.start()
            try:
                agent.wait_for(lambda s: sorted(x["artifact_digest"] for x in s["slots"]
                                                if x["state"] in ("active", "idle"))
                               == expected, timeout_s=60)
                before = residency(agent, agent_token)
            finally:
                agent.stop()

            view = catalog_view(admin.http)
            backup = root / "backup"
            done = adapterplane(["backup", "--out", str(backup)],
                                {**stack.env(), "ADAPTERPLANE_DATA_DIR": str(stack.data_dir)})
            assert done.returncode == 0, done.stderr
            # nothing changed while the backup ran (it writes no audit entry either)
            assert catalog_view(admin.http) == view
            admin_token = stack.token()
    yield Source(view=view, residency=before, backup=backup,
                 manifest=json.loads((backup / "manifest.json").read_text()),
                 admin_token=admin_token, reader_token=reader, revoked_token=revoked["token"],
                 agent_token=agent_token, s3=s3, model_dir=base, expected_resident=expected)


def test_backup_holds_the_dump_and_every_referenced_blob(source: Source) -> None:
    import hashlib

    manifest = source.manifest
    assert manifest["database"]["dialect"] == "postgresql"
    assert manifest["database"]["server_version_num"] >= 150000
    assert {b["key"] for b in manifest["blobs"]} == referenced_keys(source.view)
    for blob in manifest["blobs"]:
        data = (source.backup / "objects" / blob["key"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (blob["size"], blob["sha256"])
        assert blob["key"] == f"blobs/sha256/{blob['sha256']}"


def test_restore_into_a_fresh_stack_is_identical_and_agents_reconcile(
        source: Source, postgres_url: str, s3_endpoint: str,
        tmp_path: Path) -> None:
    from cli.stack import TOKEN_FILE, EmbeddedStack

    bucket = new_bucket(source.s3)
    with fresh_database(postgres_url, "backup_dst") as database_url:
        env = {**s3_env(s3_endpoint, bucket), "ADAPTERPLANE_DATABASE_URL": database_url}
        done = adapterplane(["restore", "--from", str(source.backup)], env)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["uploaded"] == report["blobs"] == len(source.manifest["blobs"])
        assert bucket_keys(source.s3, bucket) == sorted(
            f"objects/{b['key']}" for b in source.manifest["blobs"])

        data_dir = tmp_path / "cp"
        data_dir.mkdir()
        (data_dir / TOKEN_FILE).write_text(source.admin_token)  # restored with the tokens
        with EmbeddedStack(data_dir, port=0, embedded_only=True, extra_env=env) as stack:
            admin = Admin(stack.url, source.admin_token)
            assert catalog_view(admin.http) == source.view

            def status(token: str, ns: str) -> int:
                return admin.http.get(f"/v1/namespaces/{ns}/aliases", headers={
                    "Authorization": f"Bearer {token}"}).status_code

            assert status(source.reader_token, "acme") == 200
            assert status(source.reader_token, "beta") == 403
            assert status(source.revoked_token, "acme") == 401

            agent = AgentProcess(tmp_path / "agent.log", agent_env(
                stack.url, source.agent_token, source.model_dir, tmp_path / "agent"))
            agent.start()
            try:
                agent.wait_for(lambda s: sorted(x["artifact_digest"] for x in s["slots"]
                                                if x["state"] in ("active", "idle"))
                               == source.expected_resident, timeout_s=60)
                assert residency(agent, source.agent_token) == source.residency
            finally:
                agent.stop()

            # the restored sequences continue: the next generation and id follow the last
            history = source.view["acme/support/history"]
            art_id = max(a["id"] for a in source.view["acme/artifacts"])
            assert admin.publish("acme", "support", art_id) == history[0]["generation"] + 1


def test_restore_refuses_a_non_empty_database_and_changes_nothing(
        source: Source, postgres_url: str, s3_endpoint: str) -> None:
    bucket = new_bucket(source.s3)
    with fresh_database(postgres_url, "backup_busy") as database_url:
        env = {**s3_env(s3_endpoint, bucket), "ADAPTERPLANE_DATABASE_URL": database_url}
        migrated = adapterplane(["migrate"], env)
        assert migrated.returncode == 0, migrated.stderr
        token = adapterplane(["bootstrap-token"], env)
        assert token.returncode == 0, token.stderr
        before = relations(database_url)
        done = adapterplane(["restore", "--from", str(source.backup)], env)
        assert done.returncode == 4, done.stderr
        assert "RESTORE_TARGET_NOT_EMPTY" in done.stderr
        assert relations(database_url) == before
        assert bucket_keys(source.s3, bucket) == []


def test_restore_refuses_a_damaged_backup_before_writing(
        source: Source, postgres_url: str, s3_endpoint: str, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(source.backup, damaged)
    blob = damaged / "objects" / source.manifest["blobs"][-1]["key"]
    data = bytearray(blob.read_bytes())
    data[0] ^= 0xFF
    blob.write_bytes(bytes(data))
    bucket = new_bucket(source.s3)
    with fresh_database(postgres_url, "backup_bad") as database_url:
        env = {**s3_env(s3_endpoint, bucket), "ADAPTERPLANE_DATABASE_URL": database_url}
        done = adapterplane(["restore", "--from", str(damaged)], env)
        assert done.returncode == 5, done.stderr
        assert "BACKUP_INVALID" in done.stderr
        assert relations(database_url) == {}
        assert bucket_keys(source.s3, bucket) == []


# ---------------------------------------------------------------- SQLite + file://


def test_embedded_sqlite_and_file_store_round_trip(tmp_path: Path, assets: Assets) -> None:
    """The embedded default: everything under one data dir, restored under another."""
    source_dir, target_dir, out = tmp_path / "var", tmp_path / "restored", tmp_path / "backup"
    settings = make_settings(f"sqlite:///{source_dir / 'adapterplane.db'}", source_dir)
    upgrade_to_head(settings.database_url)
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    with TestClient(app) as client:
        setup_namespace(Api(app, client, settings, admin), assets.abi)
        for adapter in (assets.adapter_a, assets.adapter_b):
            pushed = push_dir(client, admin, "acme", assets.h_base, adapter).json()
            pushed = client.get(f"/v1/namespaces/acme/artifacts/{pushed['id']}",
                                headers=admin).json()
            assert pushed["state"] == "validated", pushed  # jobs run inline
            r = client.post("/v1/namespaces/acme/aliases/bot/publish", headers=admin,
                            json={"artifact": str(pushed["id"])})
            assert r.status_code in (200, 201), r.text
        r = client.post("/v1/namespaces/acme/aliases/bot/rollback", headers=admin, json={})
        assert r.status_code in (200, 201), r.text
        client.headers.update(admin)
        view = catalog_view(client)
    close_app(app)
    assert [g["action"] for g in view["acme/bot/history"]] == ["rollback", "publish", "publish"]

    embedded = {"ADAPTERPLANE_DATA_DIR": str(source_dir)}
    done = adapterplane(["backup", "--out", str(out)], embedded)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["database"]["dialect"] == "sqlite"
    assert {x["key"] for x in manifest["blobs"]} == referenced_keys(view)
    again = adapterplane(["backup", "--out", str(out)], embedded)
    assert again.returncode == 2 and "BACKUP_OUT_NOT_EMPTY" in again.stderr

    restored = {"ADAPTERPLANE_DATA_DIR": str(target_dir)}
    done = adapterplane(["restore", "--from", str(out)], restored)
    assert done.returncode == 0, done.stderr
    stored = sorted(p.relative_to(target_dir / "objects").as_posix()
                    for p in (target_dir / "objects").rglob("*") if p.is_file())
    assert stored == sorted(x["key"] for x in manifest["blobs"])
    app = create_app(make_settings(f"sqlite:///{target_dir / 'adapterplane.db'}", target_dir))
    with TestClient(app, headers=admin) as client:
        assert catalog_view(client) == view
    close_app(app)

    # a second restore into the now populated database is refused, and changes nothing
    before = (target_dir / "adapterplane.db").read_bytes()
    refused = adapterplane(["restore", "--from", str(out)], restored)
    assert refused.returncode == 4 and "RESTORE_TARGET_NOT_EMPTY" in refused.stderr
    assert (target_dir / "adapterplane.db").read_bytes() == before
