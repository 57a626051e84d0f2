"""adapterctl collections: fit on the real worker, inspect, push a member, publish it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from on_terminal import PROGRESS_BAR, adapterctl_on_terminal
from test_lifecycle import CliAssets, Invoke, PushWait, ok_json


def test_fit_show_member_publish(adapterctl: Invoke, cli_assets: CliAssets, h_base: str,
                                 namespace: str, push_wait: PushWait, tmp_path: Path,
                                 control_plane: Any) -> None:
    from dataplane.assets import make_peft_adapter

    twin = make_peft_adapter(cli_assets.base, tmp_path / "twin", seed=5, rank=2, alpha=4,
                             target_modules=["q_proj", "v_proj"])
    a = ok_json(push_wait(str(cli_assets.adapter_a)))
    t = ok_json(push_wait(str(twin)))
    fitted = ok_json(adapterctl(
        "-o", "json", "collections", "fit", namespace, "-s", str(a["id"]),
        "-s", f"sha256:{t['digest']}", "--base", "cli-tests-tiny", "--name", "pair",
        "--rank", "6", "--max-relative-error", "1/10000", "--wait", "--timeout", "120"))
    assert fitted["state"] == "fitted", fitted
    assert fitted["metrics"]["max_relative_error"] < 1e-4
    assert [s["artifact_id"] for s in fitted["sources"]] == [a["id"], t["id"]]

    shown = ok_json(adapterctl("-o", "json", "collections", "show", namespace,
                               f"sha256:{fitted['digest']}"))
    assert shown["id"] == fitted["id"]
    listed = ok_json(adapterctl("-o", "json", "collections", "list", namespace,
                                "--state", "fitted"))
    assert [c["id"] for c in listed["items"]] == [fitted["id"]]
    table = adapterctl("collections", "show", namespace, str(fitted["id"]))
    assert table.exit_code == 0 and "fitted" in table.stdout

    got = ok_json(adapterctl("-o", "json", "collections", "download", namespace,
                             str(fitted["id"]), str(tmp_path / "bundle")))
    assert got["digest"] == fitted["digest"]
    from dataplane.collections import read_bundle

    assert read_bundle(tmp_path / "bundle").h_collection == fitted["digest"]
    # a person at a terminal sees each file's download progress
    watched = adapterctl_on_terminal(control_plane.url, control_plane.token(), "collections",
                                     "download", namespace, str(fitted["id"]),
                                     str(tmp_path / "watched"))
    assert watched.returncode == 0, watched.terminal
    assert "download collection.safetensors" in watched.terminal
    assert PROGRESS_BAR in watched.terminal
    assert read_bundle(tmp_path / "watched").h_collection == fitted["digest"]

    member = ok_json(adapterctl("-o", "json", "collections", "member", namespace,
                                str(fitted["id"]), "1", "--wait"))
    assert member["state"] == "validated", member
    gen = ok_json(adapterctl("-o", "json", "publish", f"{namespace}/twin-compressed",
                             str(member["id"])))
    assert (gen["generation"], gen["artifact"]["id"]) == (1, member["id"])

    # stored bytes that no longer match their digest: refused, nothing half-written left
    import httpx

    bundle = httpx.get(f"{control_plane.url}/v1/namespaces/{namespace}/collections/"
                       f"{fitted['id']}/bundle", timeout=30,
                       headers={"Authorization": f"Bearer {control_plane.token()}"}).json()
    stored = Path(unquote(urlparse(bundle["files"]["collection.json"]["url"]).path))
    stored.write_bytes(stored.read_bytes() + b" ")
    bad = adapterctl("collections", "download", namespace, str(fitted["id"]),
                     str(tmp_path / "again"))
    assert bad.exit_code == 5 and "CHECKSUM_MISMATCH" in bad.stderr, bad.output
    assert not (tmp_path / "again" / "collection.json").exists()
    assert [p.name for p in (tmp_path / "again").iterdir()
            if p.name.endswith(".partial")] == []


def test_fit_of_mismatched_members_exits_with_the_rejection_code(
        adapterctl: Invoke, cli_assets: CliAssets, namespace: str, push_wait: PushWait) -> None:
    a = ok_json(push_wait(str(cli_assets.adapter_a)))
    b = ok_json(push_wait(str(cli_assets.adapter_b)))  # other target modules
    result = adapterctl("collections", "fit", namespace, "-s", str(a["id"]), "-s",
                        str(b["id"]), "--base", "cli-tests-tiny", "--name", "mixed",
                        "--rank", "2", "--wait", "--timeout", "120")
    assert result.exit_code == 5, result.output
    assert "error: COLLECTION_INVALID: members must adapt the same modules" in result.stderr
    shown: Any = json.loads(adapterctl("-o", "json", "collections", "list", namespace).stdout)
    assert shown["items"][0]["rejection"]["code"] == "collection_invalid"
