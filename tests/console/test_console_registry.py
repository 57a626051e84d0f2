"""Artifact, collection and audit pages over real HTTP: what they show comes from the
same registry `adapterctl` reads, and their filters select what the API's rows say."""

from __future__ import annotations

import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import httpx
import pytest

from dataplane.assets import make_peft_adapter
from tests.console.console_client import login
from tests.console.seed import NAMESPACE, Seeded, adapterctl


@pytest.fixture(scope="module")
def admin(seeded: Seeded) -> Iterator[httpx.Client]:
    client = login(seeded.url, seeded.admin)
    yield client
    client.close()


def audit_rows(html: str) -> list[tuple[str, str, str]]:
    """(actor, action, target) of each audit table row."""
    return re.findall(r"<tr>\s*<th scope=\"row\"><time[^>]*>[^<]*</time></th>\s*"
                      r"<td>([^<]*)</td>\s*<td><code>([^<]*)</code></td>\s*<td>[^<]*</td>\s*"
                      r"<td><code>([^<]*)</code></td>", html)


def test_artifact_list_filters_by_state(seeded: Seeded, admin: httpx.Client) -> None:
    page = admin.get(f"/ui/namespaces/{NAMESPACE}/artifacts", params={"state": "rejected"})
    assert page.status_code == 200
    listed = re.findall(r'artifacts/(\d+)">#', page.text)
    assert listed == [str(seeded.artifacts["nan"]["id"])]
    assert "<code>non_finite</code>" in page.text
    unknown = admin.get(f"/ui/namespaces/{NAMESPACE}/artifacts", params={"state": "lost"})
    assert unknown.status_code == 422 and "unknown artifact state" in unknown.text


def test_validated_artifact_shows_identities_and_sizes(seeded: Seeded,
                                                       admin: httpx.Client) -> None:
    shown = adapterctl(seeded.url, seeded.admin, "artifacts", "show", NAMESPACE,
                       str(seeded.artifacts["a"]["id"]))
    page = admin.get(f"/ui/namespaces/{NAMESPACE}/artifacts/sha256:{shown['digest']}")
    assert page.status_code == 200
    for value in (shown["digest"], shown["base"], shown["upload_sha256"],
                  shown["validated_record"]["peft_config_sha256"]):
        assert value in page.text
    for name, ref in shown["files"].items():
        assert f"<code>{name}</code>" in page.text and ref["sha256"] in page.text
    assert f"{shown['size_bytes']:,} B".replace(",", " ") in page.text
    missing = admin.get(f"/ui/namespaces/{NAMESPACE}/artifacts/999999")
    assert missing.status_code == 404 and "artifact not found: 999999" in missing.text


def test_collection_members_show_their_fit_error(seeded: Seeded, admin: httpx.Client,
                                                 tmp_path: Path) -> None:
    base = seeded.assets_root / "base"
    twin = make_peft_adapter(base, tmp_path / "twin", seed=5, rank=2, alpha=4,
                             target_modules=["q_proj", "v_proj"])
    t = adapterctl(seeded.url, seeded.admin, "push", str(twin), "-n", NAMESPACE, "-b",
                   seeded.artifacts["a"]["base"], "--wait", "--timeout", "60")
    # shared rank 2 cannot hold a rank-4 and a rank-2 adapter exactly: a strict threshold
    # refuses the release and keeps the per-member errors
    adapterctl(seeded.url, seeded.admin, "collections", "fit", NAMESPACE, "-s",
               str(seeded.artifacts["a"]["id"]), "-s", str(t["id"]), "--base",
               seeded.artifacts["a"]["base"], "--name", "pair", "--rank", "2",
               "--max-relative-error", "1/1000000", "--wait", "--timeout", "120",
               check=False)
    listed = adapterctl(seeded.url, seeded.admin, "collections", "list", NAMESPACE)
    pair = next(c for c in listed["items"] if c["name"] == "pair")
    errors = pair["metrics"]["relative_error"]
    page = admin.get(f"/ui/namespaces/{NAMESPACE}/collections")
    assert page.status_code == 200
    section = page.text[page.text.index(f'id="collection-{pair["id"]}"'):]
    assert f"<code>{pair['rejection']['code']}</code>" in section
    cells = re.findall(r'<td class="num">(\d\.\d{4})( <strong>over threshold</strong>)?</td>',
                       section)
    assert [float(value) for value, _ in cells] == [round(e, 4) for e in errors]
    assert [bool(flag) for _, flag in cells] == [
        Fraction(e) > Fraction(1, 1000000) for e in errors]


def test_audit_filters(seeded: Seeded, admin: httpx.Client) -> None:
    api = adapterctl(seeded.url, seeded.admin, "audit", "--namespace", NAMESPACE,
                     "--limit", "500")["items"]
    page = admin.get("/ui/audit", params={"namespace": NAMESPACE, "action": "catalog"})
    assert page.status_code == 200
    expected = [(e["actor"], e["action"], e["target"]) for e in api
                if e["action"].startswith("catalog")]
    assert expected and audit_rows(page.text) == expected
    worker = admin.get("/ui/audit", params={"actor": "worker:validate_artifact"})
    rows = audit_rows(worker.text)
    assert rows and {actor for actor, _, _ in rows} == {"worker:validate_artifact"}
    assert {action for _, action, _ in rows} <= {"artifact.validated", "artifact.rejected"}
    newest = api[0]["created_at"][:19]
    later = admin.get("/ui/audit", params={"namespace": NAMESPACE, "since": "2999-01-01T00:00"})
    assert audit_rows(later.text) == [] and "No audit entry matches." in later.text
    until = admin.get("/ui/audit", params={"namespace": NAMESPACE, "until": newest})
    assert len(audit_rows(until.text)) < len(api)


def test_audit_needs_admin(seeded: Seeded) -> None:
    client = login(seeded.url, seeded.reader)
    try:
        for params in ({}, {"namespace": NAMESPACE}):
            refused = client.get("/ui/audit", params=params)
            assert refused.status_code == 403 and "FORBIDDEN" in refused.text
    finally:
        client.close()
