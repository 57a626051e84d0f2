"""The console over real HTTP (httpx against the API process): sessions, scopes, CSRF,
error pages and the compare-and-swap conflict, without a browser."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.console.console_client import csrf_of, login
from tests.console.seed import NAMESPACE, Seeded, adapterctl


@pytest.fixture(scope="module")
def admin(seeded: Seeded) -> Iterator[httpx.Client]:
    client = login(seeded.url, seeded.admin)
    yield client
    client.close()


@pytest.fixture(scope="module")
def reader(seeded: Seeded) -> Iterator[httpx.Client]:
    client = login(seeded.url, seeded.reader)
    yield client
    client.close()


def _publish_twice(seeded: Seeded) -> str:
    """A fresh alias at generation 2 (artifacts a then b)."""
    alias = f"cas-{uuid.uuid4().hex[:8]}"
    for expected, name in ((0, "a"), (1, "b")):
        adapterctl(seeded.url, seeded.admin, "publish", f"{NAMESPACE}/{alias}",
                   str(seeded.artifacts[name]["id"]), "--expected-generation", str(expected))
    return alias


def test_session_cookie_is_httponly_and_strict(seeded: Seeded) -> None:
    with httpx.Client(base_url=seeded.url, timeout=10) as client:
        csrf = csrf_of(client.get("/ui/login"))
        answer = client.post("/ui/login", data={"token": seeded.admin, "csrf": csrf})
    cookie = next(v for k, v in answer.headers.multi_items()
                  if k == "set-cookie" and v.startswith("adapterplane_console="))
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "path", "samesite"} <= attributes
    assert "samesite=strict" in cookie.lower() and "path=/ui" in cookie.lower()
    assert answer.headers["location"] == "/ui/namespaces"


def test_anonymous_pages_redirect_to_login_and_bad_tokens_are_refused(seeded: Seeded) -> None:
    with httpx.Client(base_url=seeded.url, timeout=10) as client:
        page = client.get(f"/ui/namespaces/{NAMESPACE}/aliases")
        assert page.status_code == 303
        assert page.headers["location"] == (
            f"/ui/login?next=%2Fui%2Fnamespaces%2F{NAMESPACE}%2Faliases")
        csrf = csrf_of(client.get("/ui/login"))
        refused = client.post("/ui/login", data={"token": "ap_" + "x" * 43, "csrf": csrf})
        assert refused.status_code == 401
        assert "unknown or revoked token (UNAUTHENTICATED)" in refused.text
        assert "adapterplane_console=" not in refused.headers.get("set-cookie", "")
        # a login form posted without the value this browser was given
        forged = client.post("/ui/login", data={"token": seeded.admin, "csrf": "forged"})
        assert forged.status_code == 403 and "CSRF_REJECTED" in forged.text


def test_unknown_alias_is_a_404_page(admin: httpx.Client) -> None:
    page = admin.get(f"/ui/namespaces/{NAMESPACE}/aliases/no-such-alias")
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "404: NOT_FOUND" in page.text and f"alias {NAMESPACE}/no-such-alias not found" in (
        page.text)
    assert page.headers["x-frame-options"] == "DENY"


def test_read_only_token_sees_no_actions_and_is_refused_on_post(
        seeded: Seeded, reader: httpx.Client) -> None:
    alias = _publish_twice(seeded)
    page = reader.get(f"/ui/namespaces/{NAMESPACE}/aliases/{alias}")
    assert page.status_code == 200 and f"{alias}" in page.text
    assert "Roll back" not in page.text and "Retire" not in page.text
    assert "Review publish" not in page.text
    confirm = reader.get(f"/ui/namespaces/{NAMESPACE}/aliases/{alias}/rollback")
    assert confirm.status_code == 403 and "FORBIDDEN" in confirm.text
    refused = reader.post(f"/ui/namespaces/{NAMESPACE}/aliases/{alias}/rollback",
                          data={"csrf": csrf_of(page), "expected_generation": "2"})
    assert refused.status_code == 403 and "FORBIDDEN" in refused.text
    history = adapterctl(seeded.url, seeded.admin, "history", f"{NAMESPACE}/{alias}")
    assert [g["generation"] for g in history["items"]] == [2, 1]


def test_forged_post_without_csrf_changes_nothing(seeded: Seeded, admin: httpx.Client) -> None:
    alias = _publish_twice(seeded)
    path = f"/ui/namespaces/{NAMESPACE}/aliases/{alias}/retire"
    for data in ({"expected_generation": "2"}, {"expected_generation": "2", "csrf": "0" * 64}):
        refused = admin.post(path, data=data)
        assert refused.status_code == 403 and "CSRF_REJECTED" in refused.text
    history = adapterctl(seeded.url, seeded.admin, "history", f"{NAMESPACE}/{alias}")
    assert [g["generation"] for g in history["items"]] == [2, 1]


def test_stale_expected_generation_is_a_conflict_page(seeded: Seeded,
                                                      admin: httpx.Client) -> None:
    alias = _publish_twice(seeded)
    path = f"/ui/namespaces/{NAMESPACE}/aliases/{alias}/rollback"
    confirm = admin.get(path, params={"expected_generation": 2})
    assert confirm.status_code == 200
    assert 'name="expected_generation" value="2"' in confirm.text
    # someone else moves the alias on meanwhile
    adapterctl(seeded.url, seeded.admin, "publish", f"{NAMESPACE}/{alias}",
               str(seeded.artifacts["a"]["id"]), "--expected-generation", "2")
    conflict = admin.post(path, data={"csrf": csrf_of(confirm), "expected_generation": "2",
                                      "reason": "bad rollout"})
    assert conflict.status_code == 409
    assert "GENERATION_CONFLICT" in conflict.text
    assert "expected generation 2, current is 3" in conflict.text
    # the re-rendered confirmation expects the now-current generation, keeps the reason
    assert 'name="expected_generation" value="3"' in conflict.text
    assert "bad rollout" in conflict.text
    history = adapterctl(seeded.url, seeded.admin, "history", f"{NAMESPACE}/{alias}")
    assert [g["generation"] for g in history["items"]] == [3, 2, 1]
    # confirming again against generation 3 appends generation 4 (back to artifact b)
    done = admin.post(path, data={"csrf": csrf_of(conflict), "expected_generation": "3"})
    assert done.status_code == 303
    assert done.headers["location"].endswith(f"/aliases/{alias}?changed=4")
    resolved = adapterctl(seeded.url, seeded.admin, "resolve", f"{NAMESPACE}/{alias}")
    assert (resolved["generation"], resolved["action"], resolved["artifact"]["id"]) == (
        4, "rollback", seeded.artifacts["b"]["id"])


def test_invalid_form_values_are_typed_errors(seeded: Seeded, admin: httpx.Client) -> None:
    alias = _publish_twice(seeded)
    page = admin.get(f"/ui/namespaces/{NAMESPACE}/aliases/{alias}")
    path = f"/ui/namespaces/{NAMESPACE}/aliases/{alias}/retire"
    bad = admin.post(path, data={"csrf": csrf_of(page), "expected_generation": "two"})
    assert bad.status_code == 422 and "VALIDATION_ERROR" in bad.text
    unknown = admin.get(f"/ui/namespaces/{NAMESPACE}/aliases/{alias}/explode")
    assert unknown.status_code == 422 and "422: VALIDATION_ERROR" in unknown.text
    assert "invalid request: path.action" in unknown.text
    bad_query = admin.get(f"/ui/namespaces/{NAMESPACE}/aliases/{alias}",
                          params={"diff_from": "x"})
    assert bad_query.status_code == 422 and "query.diff_from" in bad_query.text
    bad_time = admin.get("/ui/audit", params={"since": "yesterday"})
    assert bad_time.status_code == 422 and "invalid since time" in bad_time.text
    history = adapterctl(seeded.url, seeded.admin, "history", f"{NAMESPACE}/{alias}")
    assert [g["generation"] for g in history["items"]] == [2, 1]


def test_logout_and_revocation_end_the_session(seeded: Seeded) -> None:
    made = adapterctl(seeded.url, seeded.admin, "tokens", "create", "--name", "short-lived",
                      "--grant", f"{NAMESPACE}:read")
    aliases = f"/ui/namespaces/{NAMESPACE}/aliases"
    client = login(seeded.url, made["token"])
    try:
        page = client.get(aliases)
        assert page.status_code == 200
        out = client.post("/ui/logout", data={"csrf": csrf_of(page)})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert client.get(aliases).status_code == 303  # back to the login page
    finally:
        client.close()
    client = login(seeded.url, made["token"])
    try:
        assert client.get(aliases).status_code == 200
        adapterctl(seeded.url, seeded.admin, "tokens", "revoke", str(made["id"]))
        revoked = client.get(aliases)  # the very next request
        assert revoked.status_code == 303 and revoked.headers["location"].startswith(
            "/ui/login?next=")
    finally:
        client.close()


def test_login_goes_back_only_to_console_paths(seeded: Seeded) -> None:
    for target, landing in (("/ui/audit?namespace=demo", "/ui/audit?namespace=demo"),
                            ("https://evil.example/", "/ui/namespaces"),
                            ("//evil.example/ui/", "/ui/namespaces"),
                            ("/uix", "/ui/namespaces")):
        with httpx.Client(base_url=seeded.url, timeout=10) as client:
            csrf = csrf_of(client.get("/ui/login", params={"next": target}))
            answer = client.post("/ui/login", data={"token": seeded.admin, "csrf": csrf,
                                                    "next": target})
            assert answer.headers["location"] == landing, target
