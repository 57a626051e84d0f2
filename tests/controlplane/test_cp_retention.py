"""Artifact deletion and blob garbage collection on a real Postgres (and the embedded
SQLite where the concurrency argument differs), with real file:// and S3 (moto) stores.

- delete: allowed for a never-published artifact and a rejected one; refused (409
  ARTIFACT_REFERENCED, nothing changed) while a current or historical generation or a
  collection names it; needs publish on the namespace; audited.
- GC: removes exactly the unreferenced blobs older than the grace (the reference keys
  are hashed here from the adapter files); a dry run removes nothing; blobs shared
  with a live artifact and a collection's bundle stay.
- a concurrent push of the same digest never loses its blob, whichever of GC and the
  push reaches the blob first (the pausing store places each exactly), and in free runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from cp_helpers import Api, Assets, bootstrap_token, close_app, make_settings, setup_namespace
from fastapi.testclient import TestClient
from retention_helpers import (
    PausingStore,
    age_leases,
    backdate,
    blob_keys_of,
    file_blob_key,
    file_blob_keys,
    stored_keys,
)
from sqlalchemy import func, select

from controlplane.app import create_app
from controlplane.artifacts.service import push_artifact
from controlplane.db import session_scope
from controlplane.models import Artifact, AuditEntry, CatalogGeneration, utcnow
from controlplane.retention.collector import collect_garbage
from controlplane.storage import ADAPTER_FILES, store_from_settings
from controlplane.storage.file_store import FileObjectStore

ART = "/v1/namespaces/acme/artifacts"


@pytest.fixture
def pg_api(pg_url: str, tmp_path: Path) -> Iterator[Api]:
    settings = make_settings(pg_url, tmp_path / "var")
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    with TestClient(app) as client:
        yield Api(app=app, client=client, settings=settings, admin=admin)
    close_app(app)


def push(api: Api, adapter: Path, ns: str = "acme") -> dict[str, Any]:
    files = {n: (n, (adapter / n).read_bytes(), "application/octet-stream")
             for n in ADAPTER_FILES}
    r = api.client.post(f"/v1/namespaces/{ns}/artifacts", headers=api.admin,
                        data={"base": api_h_base(api)}, files=files)
    assert r.status_code in (200, 202), r.text
    body: dict[str, Any] = api.client.get(f"/v1/namespaces/{ns}/artifacts/{r.json()['id']}",
                                          headers=api.admin).json()
    return body


def api_h_base(api: Api) -> str:
    return str(api.client.get("/v1/bases", headers=api.admin).json()["items"][0]["h_base"])


def file_store(api: Api) -> FileObjectStore:
    store = api.app.state.store
    assert isinstance(store, FileObjectStore)
    return store


def snapshot(api: Api) -> tuple[int, int, int]:
    with session_scope(api.app.state.session_factory) as s:
        return (s.scalar(select(func.count()).select_from(Artifact)) or 0,
                s.scalar(select(func.count()).select_from(CatalogGeneration)) or 0,
                s.scalar(select(func.count()).select_from(AuditEntry)) or 0)


def gc(api: Api, dry_run: bool) -> dict[str, Any]:
    r = api.client.post("/v1/gc", headers=api.admin, json={"dry_run": dry_run})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def gc_audit(api: Api) -> list[dict[str, Any]]:
    items = api.client.get("/v1/audit", headers=api.admin).json()["items"]
    return [e for e in items if e["action"] == "gc.run"]


# ---------------------------------------------------------------- delete


def test_delete_unpublished_and_rejected(pg_api: Api, assets: Assets) -> None:
    api = pg_api
    setup_namespace(api, assets.abi)
    good, bad = push(api, assets.adapter_a), push(api, assets.adapter_big_rank)
    assert (good["state"], bad["state"]) == ("validated", "rejected")
    reader = api.token([{"namespace": "acme", "role": "read"}], name="reader")
    before = snapshot(api)
    denied = api.client.delete(f"{ART}/{good['id']}", headers=reader)
    assert denied.status_code == 403 and denied.json()["code"] == "FORBIDDEN"
    missing = api.client.delete(f"{ART}/999999", headers=api.admin)
    assert missing.status_code == 404 and missing.json()["code"] == "NOT_FOUND"
    assert snapshot(api) == before

    publisher = api.token([{"namespace": "acme", "role": "publish"}], name="publisher")
    for artifact in (good, bad):
        r = api.client.delete(f"{ART}/{artifact['id']}", headers=publisher)
        assert r.status_code == 200, r.text
        assert r.json()["id"] == artifact["id"] and r.json()["state"] == artifact["state"]
        assert api.client.get(f"{ART}/{artifact['id']}",
                              headers=api.admin).status_code == 404
    audit = api.client.get("/v1/audit?namespace=acme", headers=api.admin).json()["items"]
    deleted = [e for e in audit if e["action"] == "artifact.delete"]
    assert sorted(e["target"] for e in deleted) == sorted(
        f"artifact:{a['id']}" for a in (good, bad))
    assert all(e["actor"].endswith(":publisher") for e in deleted)
    # the blobs stay for GC: deleting a row never touches the store
    assert blob_keys_of(good) <= stored_keys(file_store(api))
    # the same bytes pushed again make a new artifact
    again = push(api, assets.adapter_a)
    assert again["id"] != good["id"] and again["state"] == "validated"


def test_delete_refused_while_referenced(pg_api: Api, assets: Assets) -> None:
    api = pg_api
    setup_namespace(api, assets.abi)
    a, b, c = (push(api, p) for p in (assets.adapter_a, assets.adapter_b, assets.adapter_b))
    assert b["id"] == c["id"]  # the same bytes: one artifact
    pub = "/v1/namespaces/acme/aliases/bot"
    for artifact in (a, b):
        assert api.client.post(f"{pub}/publish", headers=api.admin,
                               json={"artifact": str(artifact["id"])}).status_code == 201
    assert api.client.post(f"{pub}/retire", headers=api.admin, json={}).status_code == 201
    before = snapshot(api)
    for artifact, generations in ((a, [1]), (b, [2])):
        for ref in (str(artifact["id"]), f"sha256:{artifact['digest']}"):
            r = api.client.delete(f"{ART}/{ref}", headers=api.admin)
            assert r.status_code == 409, r.text
            body = r.json()
            assert body["code"] == "ARTIFACT_REFERENCED"
            assert [x["table"] for x in body["detail"]["references"]] == (
                ["catalog_generations"] * len(generations))
    assert snapshot(api) == before
    # history stays resolvable: roll back to the first generation's artifact
    back = api.client.post(f"{pub}/rollback", headers=api.admin, json={"to_generation": 1})
    assert back.status_code == 201 and back.json()["artifact"]["id"] == a["id"]


def test_delete_refused_for_a_collection_source(pg_api: Api, assets: Assets) -> None:
    api = pg_api
    setup_namespace(api, assets.abi)
    a = push(api, assets.adapter_a)
    r = api.client.post("/v1/namespaces/acme/collections", headers=api.admin, json={
        "name": "c", "base": assets.h_base, "sources": [a["id"]], "rank": 4,
        "max_relative_error": "1/100000"})
    assert r.status_code == 202, r.text
    collection = api.client.get(f"/v1/namespaces/acme/collections/{r.json()['id']}",
                                headers=api.admin).json()
    assert collection["state"] == "fitted", collection
    before = snapshot(api)
    refused = api.client.delete(f"{ART}/{a['id']}", headers=api.admin)
    assert refused.status_code == 409 and refused.json()["code"] == "ARTIFACT_REFERENCED"
    assert refused.json()["detail"]["references"] == [
        {"table": "collections", "id": collection["id"]}]
    assert snapshot(api) == before
    # GC keeps the bundle's blobs and the source's, however old
    store = file_store(api)
    bundle = {collection["storage_key"], *(f["key"] for f in collection["files"].values())}
    backdate(store, stored_keys(store))
    age_leases(api.app.state.session_factory)
    report = gc(api, dry_run=False)
    assert report["removed"] == [] and report["kept_referenced"] == len(stored_keys(store))
    assert bundle | blob_keys_of(a) <= stored_keys(store)


def test_a_collection_submitted_during_its_sources_delete_is_refused(pg_api: Api,
                                                                    assets: Assets) -> None:
    """The delete holds the source row (FOR UPDATE) when the collection is submitted: the
    submit waits for it, then finds the source gone (404), and no collection names a
    deleted artifact."""
    api = pg_api
    setup_namespace(api, assets.abi)
    a = push(api, assets.adapter_a)
    answers: list[Any] = []
    with session_scope(api.app.state.session_factory) as deleting:
        row = deleting.scalars(select(Artifact).where(Artifact.id == a["id"])
                               .with_for_update(of=Artifact)).one()
        submit = threading.Thread(target=lambda: answers.append(api.client.post(
            "/v1/namespaces/acme/collections", headers=api.admin, json={
                "name": "c", "base": assets.h_base, "sources": [a["id"]], "rank": 4})))
        submit.start()
        submit.join(timeout=1.0)
        assert submit.is_alive(), "the submit did not wait for the delete's lock"
        deleting.delete(row)
        deleting.commit()
    submit.join(timeout=30)
    assert answers and answers[0].status_code == 404, answers[0].text
    listed = api.client.get("/v1/namespaces/acme/collections", headers=api.admin).json()
    assert listed["items"] == []


# ---------------------------------------------------------------- GC


def test_gc_removes_orphans_after_the_grace_only(pg_api: Api, assets: Assets) -> None:
    api = pg_api
    setup_namespace(api, assets.abi)
    setup_namespace(api, assets.abi, "other")
    store = file_store(api)
    gone, kept = push(api, assets.adapter_a), push(api, assets.adapter_b)
    shared = push(api, assets.adapter_a, "other")  # the same blobs as `gone`
    assert blob_keys_of(shared) == blob_keys_of(gone)
    orphan = push(api, assets.adapter_big_rank)
    for artifact in (gone, orphan):
        assert api.client.delete(f"/v1/namespaces/acme/artifacts/{artifact['id']}",
                                 headers=api.admin).status_code == 200
    orphan_keys = blob_keys_of(orphan)
    assert file_blob_keys(assets.adapter_big_rank) < orphan_keys  # + its manifest
    everything = stored_keys(store)

    young = gc(api, dry_run=False)  # all written just now: within the 24 h grace
    assert young["removed"] == [] and young["kept_recent"] == len(everything)
    assert stored_keys(store) == everything

    backdate(store, everything)
    leased = gc(api, dry_run=True)  # the pushes' leases are fresh: nothing yet
    assert leased["removed"] == [] and leased["kept_leased"] == len(orphan_keys)
    age_leases(api.app.state.session_factory)
    dry = gc(api, dry_run=True)
    assert {r["key"] for r in dry["removed"]} == orphan_keys
    assert dry["removed_bytes"] == sum((store.root / k).stat().st_size for k in orphan_keys)
    assert dry["kept_referenced"] == len(everything) - len(orphan_keys)
    assert stored_keys(store) == everything  # a dry run removes nothing
    assert len(gc_audit(api)) == 1  # the first pass; the dry runs wrote nothing

    real = gc(api, dry_run=False)
    assert {r["key"] for r in real["removed"]} == orphan_keys
    assert stored_keys(store) == everything - orphan_keys
    for artifact in (kept, shared):  # what lives still verifies
        for ref in artifact["files"].values():
            assert store.blob_fault(ref["sha256"], ref["size"], ref["key"]) is None
    entry = gc_audit(api)[0]  # newest first
    assert entry["detail"]["removed"] == len(orphan_keys)
    assert entry["actor"] == "token:1:admin" and entry["namespace"] is None
    assert sorted(entry["detail"]["keys"]) == sorted(orphan_keys)
    assert gc(api, dry_run=False)["removed"] == []  # nothing left to do


def test_gc_needs_admin_on_every_namespace_and_a_valid_body(pg_api: Api,
                                                            assets: Assets) -> None:
    api = pg_api
    setup_namespace(api, assets.abi)
    ns_admin = api.token([{"namespace": "acme", "role": "admin"}], name="ns-admin")
    r = api.client.post("/v1/gc", headers=ns_admin, json={"dry_run": True})
    assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
    r = api.client.post("/v1/gc", headers=api.admin, json={"dry_run": "perhaps"})
    assert r.status_code == 422 and r.json()["code"] == "VALIDATION_ERROR"
    r = api.client.post("/v1/gc", headers=api.admin, json={"dryrun": True})
    assert r.status_code == 422
    assert api.client.post("/v1/gc", headers=api.admin).json()["dry_run"] is False


def test_gc_on_s3(pg_url: str, tmp_path: Path, s3_endpoint: str, assets: Assets) -> None:
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                 aws_access_key_id="test", aws_secret_access_key="test-secret",
                 ).create_bucket(Bucket="cp-retention")
    settings = make_settings(pg_url, tmp_path / "var", storage_url="s3://cp-retention/objs",
                             s3_endpoint_url=s3_endpoint, s3_access_key_id="test",
                             s3_secret_access_key="test-secret")
    app = create_app(settings)
    api = Api(app=app, client=TestClient(app), settings=settings,
              admin={"Authorization": f"Bearer {bootstrap_token(settings)}"})
    try:
        setup_namespace(api, assets.abi)
        kept, orphan = push(api, assets.adapter_b), push(api, assets.adapter_a)
        assert api.client.delete(f"{ART}/{orphan['id']}", headers=api.admin).status_code == 200
        store = store_from_settings(settings)
        listed = {o.key: o for o in store.list_objects("blobs/sha256/")}
        assert set(listed) == blob_keys_of(kept) | blob_keys_of(orphan)
        assert all(o.size == store.size_of(k) for k, o in listed.items())
        later = utcnow() + timedelta(seconds=settings.gc_grace_s + 60)
        with session_scope(app.state.session_factory) as session:
            dry = collect_garbage(session, store, settings, dry_run=True, actor="t",
                                  now=later)
            assert {r.key for r in dry.removed} == blob_keys_of(orphan)
            assert {o.key for o in store.list_objects("blobs/sha256/")} == set(listed)
            now = collect_garbage(session, store, settings, dry_run=False, actor="t")
            assert now.removed == [] and now.kept_recent == len(listed)
            real = collect_garbage(session, store, settings, dry_run=False, actor="t",
                                   now=later)
        assert {r.key for r in real.removed} == blob_keys_of(orphan)
        assert {o.key for o in store.list_objects("blobs/sha256/")} == blob_keys_of(kept)
        store.delete(next(iter(blob_keys_of(orphan))))  # deleting what is gone is fine
    finally:
        api.client.close()
        close_app(app)


# ---------------------------------------------------------------- concurrent push


def _orphan(api: Api, adapter: Path, store: FileObjectStore) -> set[str]:
    """Push `adapter`, delete its row, age its blobs: GC's next candidates."""
    artifact = push(api, adapter)
    assert api.client.delete(f"{ART}/{artifact['id']}", headers=api.admin).status_code == 200
    keys = blob_keys_of(artifact)
    backdate(store, keys)
    age_leases(api.app.state.session_factory)
    return keys


def _push_in_thread(api: Api, store: FileObjectStore, adapter: Path,
                    results: list[Any]) -> threading.Thread:
    h_base = api_h_base(api)

    def run() -> None:
        files = {n: (adapter / n).open("rb") for n in ADAPTER_FILES}
        try:
            with session_scope(api.app.state.session_factory) as session:
                results.append(push_artifact(
                    session, store, api.app.state.jobs, api.settings, namespace="acme",
                    h_base=h_base, files=files, actor="test", source="upload")[0])
        finally:
            for handle in files.values():
                handle.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _gc_in_thread(api: Api, store: FileObjectStore, reports: list[Any]) -> threading.Thread:
    def run() -> None:
        with session_scope(api.app.state.session_factory) as session:
            reports.append(collect_garbage(session, store, api.settings, dry_run=False,
                                           actor="test"))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _blobs_intact(store: FileObjectStore, artifact: Artifact) -> None:
    for ref in artifact.files.values():
        assert store.blob_fault(ref["sha256"], ref["size"], ref["key"]) is None, ref
    assert store.exists(artifact.storage_key)


def test_push_waits_for_a_removal_in_progress(api: Api, assets: Assets) -> None:
    """GC first: it holds a key's lease row while deleting; the push's lease waits for
    its commit, then finds the blob gone and uploads it again."""
    setup_namespace(api, assets.abi)
    store = PausingStore(file_store(api).root)
    keys = _orphan(api, assets.adapter_a, store)
    store.pause_delete = True
    reports: list[Any] = []
    gc_thread = _gc_in_thread(api, store, reports)
    assert store.entered.wait(30)
    pushed: list[Any] = []
    push_thread = _push_in_thread(api, store, assets.adapter_a, pushed)
    push_thread.join(1.0)
    assert push_thread.is_alive() and not pushed  # its lease waits on GC's row lock
    store.release.set()
    gc_thread.join(30)
    push_thread.join(30)
    (artifact,) = pushed
    _blobs_intact(store, artifact)
    assert blob_keys_of({"storage_key": artifact.storage_key, "files": artifact.files}) == keys
    removed = {r.key for r in reports[0].removed}
    assert removed and removed <= keys and reports[0].kept_leased == len(keys - removed)


def test_gc_keeps_a_blob_a_push_found_already_stored(pg_api: Api, assets: Assets) -> None:
    """Push first: it leased the blobs, found them stored (no upload) and has not
    committed its row yet; a whole GC pass then keeps every leased blob."""
    api = pg_api
    setup_namespace(api, assets.abi)
    store = PausingStore(file_store(api).root)
    keys = _orphan(api, assets.adapter_a, store)
    weights = file_blob_key(assets.adapter_a / "adapter_model.safetensors")
    config = file_blob_key(assets.adapter_a / "adapter_config.json")
    store.pause_check_of = weights
    pushed: list[Any] = []
    push_thread = _push_in_thread(api, store, assets.adapter_a, pushed)
    assert store.entered.wait(30)  # leased both files, checked the config, checking weights
    with session_scope(api.app.state.session_factory) as session:
        report = collect_garbage(session, store, api.settings, dry_run=False, actor="test")
    assert report.kept_leased == 2
    assert {r.key for r in report.removed} == keys - {weights, config}  # the manifest
    store.release.set()
    push_thread.join(30)
    (artifact,) = pushed
    _blobs_intact(store, artifact)  # the manifest was uploaded again


def test_free_running_push_and_gc_never_lose_a_blob(pg_api: Api, assets: Assets) -> None:
    api = pg_api
    setup_namespace(api, assets.abi)
    store = file_store(api)
    for _round in range(8):
        _orphan(api, assets.adapter_a, store)
        pushed: list[Any] = []
        reports: list[Any] = []
        threads = [_gc_in_thread(api, store, reports),
                   _push_in_thread(api, store, assets.adapter_a, pushed)]
        for thread in threads:
            thread.join(30)
        (artifact,) = pushed
        _blobs_intact(store, artifact)
