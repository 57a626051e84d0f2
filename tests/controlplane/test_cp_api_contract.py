"""Small promises of the admin API's HTTP surface: `Allow` on 405, an empty cursor is
the first page, malformed bodies are 422 VALIDATION_ERROR, alias path parameters carry
their pattern in OpenAPI, and generation numbers are JSON integers only."""

from __future__ import annotations

import re

import pytest
from cp_helpers import Api, Assets, setup_namespace

from controlplane.catalog.schemas import ALIAS_PATTERN


def test_405_keeps_allow(api: Api) -> None:
    r = api.client.put("/v1/namespaces", headers=api.admin)
    assert (r.status_code, r.json()["code"]) == (405, "METHOD_NOT_ALLOWED")
    assert set(re.split(r",\s*", r.headers["allow"])) == {"GET", "POST"}


def test_empty_cursor_is_the_first_page(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    first = api.client.get("/v1/namespaces", headers=api.admin)
    empty = api.client.get("/v1/namespaces?cursor=", headers=api.admin)
    assert empty.status_code == 200, empty.text
    assert empty.json() == first.json()


def test_unknown_or_repeated_query_parameters_are_refused(api: Api) -> None:
    for query, key, why in (("limt=5", "limt", "not a parameter"),
                            ("limit=5&limit=6", "limit", "more than once")):
        r = api.client.get(f"/v1/namespaces?{query}", headers=api.admin)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "VALIDATION_ERROR"
        assert f"query.{key}" in r.json()["error"] and why in r.json()["error"]
    assert api.client.get("/v1/namespaces?limit=5", headers=api.admin).status_code == 200


def test_malformed_bodies_are_validation_errors(api: Api, assets: Assets) -> None:
    setup_namespace(api, assets.abi)
    bad = [
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        {"content": b"--x\r\nnot multipart at all",
         "headers": {"content-type": "multipart/form-data"}},  # no boundary
    ]
    for request in bad:
        r = api.client.post("/v1/namespaces/acme/artifacts",
                            headers={**api.admin, **request["headers"]},  # type: ignore[dict-item]
                            content=request["content"])
        assert (r.status_code, r.json()["code"]) == (422, "VALIDATION_ERROR"), r.text


def test_alias_parameters_carry_their_pattern(api: Api) -> None:
    spec = api.client.get("/openapi.json").json()
    alias_params = [p for path, item in spec["paths"].items() if "{alias}" in path
                    for op in item.values() for p in op.get("parameters", [])
                    if p["name"] == "alias"]
    assert len(alias_params) >= 6
    assert {p["schema"].get("pattern") for p in alias_params} == {ALIAS_PATTERN}
    r = api.client.get("/v1/namespaces/acme/aliases/-bad-", headers=api.admin)
    assert (r.status_code, r.json()["code"]) == (422, "VALIDATION_ERROR")


@pytest.mark.parametrize(("action", "field", "value"), [
    *[(action, "expected_generation", value) for action in ("publish", "retire", "rollback")
      for value in ("2", True, 1.0)],
    ("rollback", "to_generation", "1"), ("rollback", "to_generation", True),
])
def test_generation_numbers_are_strict_integers(api: Api, assets: Assets, action: str,
                                                field: str, value: object) -> None:
    setup_namespace(api, assets.abi)
    body: dict[str, object] = {field: value}
    if action == "publish":
        body["artifact"] = "1"
    r = api.client.post(f"/v1/namespaces/acme/aliases/bot/{action}", headers=api.admin,
                        json=body)
    assert (r.status_code, r.json()["code"]) == (422, "VALIDATION_ERROR"), r.text
    assert r.json()["detail"]["errors"][0]["loc"][-1] == field
