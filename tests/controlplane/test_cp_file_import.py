"""`file://` imports: off by default; when on, only directories inside
`file_import_roots`, never through a symlink, and one answer for every refusal."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from cp_helpers import Api, Assets, bootstrap_token, close_app, make_settings, setup_namespace
from fastapi.testclient import TestClient

from controlplane.app import create_app


def _app(sqlite_url: str, tmp_path: Path, **overrides: Any) -> Api:
    settings = make_settings(sqlite_url, tmp_path / "var", **overrides)
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {bootstrap_token(settings)}"}
    return Api(app=app, client=TestClient(app), settings=settings, admin=admin)


def _push(api: Api, h_base: str, uri: str) -> Any:
    return api.client.post("/v1/namespaces/acme/artifacts", headers=api.admin,
                           json={"base": h_base, "uri": uri})


def test_file_imports_are_off_by_default(sqlite_url: str, tmp_path: Path,
                                         assets: Assets) -> None:
    api = _app(sqlite_url, tmp_path)
    try:
        setup_namespace(api, assets.abi)
        r = _push(api, assets.h_base, assets.adapter_a.as_uri())
        assert (r.status_code, r.json()["code"]) == (403, "FORBIDDEN"), r.text
    finally:
        close_app(api.app)


def test_only_real_directories_inside_the_roots(sqlite_url: str, tmp_path: Path,
                                                assets: Assets) -> None:
    root = tmp_path / "imports"
    outside = tmp_path / "elsewhere"
    shutil.copytree(assets.adapter_a, root / "good")
    shutil.copytree(assets.adapter_b, outside / "tenant-b")
    secret = outside / "secret.json"
    secret.write_text('{"peft_type": "LORA", "password": "hunter2"}')
    (root / "dir-link").symlink_to(outside / "tenant-b", target_is_directory=True)
    shutil.copytree(assets.adapter_a, root / "file-link")
    (root / "file-link" / "adapter_config.json").unlink()
    (root / "file-link" / "adapter_config.json").symlink_to(secret)
    shutil.copytree(assets.adapter_a, root / "inner-link")
    (root / "inner-link" / "adapter_model.safetensors").unlink()
    (root / "inner-link" / "adapter_model.safetensors").symlink_to(
        root / "good" / "adapter_model.safetensors")
    api = _app(sqlite_url, tmp_path, allow_file_uri_import=True, file_import_roots=[root])
    try:
        setup_namespace(api, assets.abi)
        refused = {
            "missing": (root / "nope").as_uri(),
            "outside the roots": (outside / "tenant-b").as_uri(),
            "dot-dot out of the roots": f"file://{root}/../elsewhere/tenant-b",
            "directory symlink": (root / "dir-link").as_uri(),
            "config symlink to a file outside": (root / "file-link").as_uri(),
            "weights symlink inside the root": (root / "inner-link").as_uri(),
            "a file, not a directory": (root / "good" / "adapter_config.json").as_uri(),
            "relative": "file://imports/good",
            "another host": f"file://elsewhere{root}/good",
        }
        answers = {}
        for case, uri in refused.items():
            r = _push(api, assets.h_base, uri)
            body = r.json()
            assert body["detail"] == {"uri": uri}, (case, body)
            answers[case] = (r.status_code, body["code"], body["error"])
        assert set(answers.values()) == {
            (422, "IMPORT_SOURCE_UNAVAILABLE", "file:// import source not found or not allowed")
        }, answers
        items = api.client.get("/v1/namespaces/acme/artifacts", headers=api.admin).json()
        assert items["items"] == []
        ok = _push(api, assets.h_base, (root / "good").as_uri())
        assert ok.status_code == 202, ok.text
        stored = Path(api.settings.data_dir / "objects")
        assert b"hunter2" not in b"".join(p.read_bytes() for p in stored.rglob("*")
                                          if p.is_file())
    finally:
        close_app(api.app)


@pytest.mark.parametrize("roots", [[], ["relative/dir"]])
def test_roots_are_absolute_and_none_means_nothing(sqlite_url: str, tmp_path: Path,
                                                   assets: Assets, roots: list[str]) -> None:
    if roots:
        with pytest.raises(ValueError, match="absolute"):
            make_settings(sqlite_url, tmp_path / "var", file_import_roots=roots)
        return
    api = _app(sqlite_url, tmp_path, allow_file_uri_import=True, file_import_roots=roots)
    try:
        setup_namespace(api, assets.abi)
        r = _push(api, assets.h_base, assets.adapter_a.as_uri())
        assert (r.status_code, r.json()["code"]) == (422, "IMPORT_SOURCE_UNAVAILABLE")
    finally:
        close_app(api.app)
