"""The agent's side of control-plane trouble, and who may read its operator endpoints.

A second agent reaches the control plane through a TCP proxy the test can reset (every
kept-alive connection dropped, what a control-plane restart does) and take down
(connection refused). Resets never fail a request (the permission check is retried
on a fresh connection); during an outage a caller seen recently is still served from
the stale permission cache and anyone else gets the documented JSON 503 with
`Retry-After`, never a plain-text 500.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

import httpx
import pytest

from tests.tcp_proxy import TcpProxy

from .conftest import Deployment, extra_agent


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_operator_endpoints_need_a_global_reader(deployment: Deployment) -> None:
    for path in ("/v1/agent/state", "/v1/agent/top"):
        url = f"{deployment.agent.url}{path}"
        assert httpx.get(url, timeout=10).status_code == 401
        assert httpx.get(url, headers=_bearer("ap_unknown"), timeout=10).status_code == 401
        refused = httpx.get(url, headers=_bearer(deployment.reader_token), timeout=10)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"
        assert httpx.get(url, headers=_bearer(deployment.agent_token),
                         timeout=10).status_code == 200
    everyone = deployment.admin.token("global-reader", [{"namespace": "*", "role": "read"}])
    assert httpx.get(f"{deployment.agent.url}/v1/agent/state", headers=_bearer(everyone),
                     timeout=10).status_code == 200


def test_models_refuses_an_unknown_token(deployment: Deployment) -> None:
    url = f"{deployment.agent.url}/v1/models"
    unknown = httpx.get(url, headers=_bearer("ap_not-a-token"), timeout=10)
    assert unknown.status_code == 401, unknown.text
    assert unknown.json()["error"]["code"] == "UNAUTHENTICATED"
    known = httpx.get(url, headers=_bearer(deployment.reader_token), timeout=10)
    assert known.status_code == 200
    assert any(m["id"].startswith(f"{deployment.namespace}/") for m in known.json()["data"])


@pytest.fixture(scope="module")
def proxied(deployment: Deployment,
            tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    port = urlparse(deployment.cp.url).port
    assert port is not None
    with TcpProxy(port) as proxy, extra_agent(
            deployment, tmp_path_factory, "agent-behind-proxy",
            {"ADAPTERPLANE_AGENT_CONTROL_PLANE_URL": proxy.url,
             "ADAPTERPLANE_AGENT_AUTH_CACHE_S": "0",
             "ADAPTERPLANE_AGENT_AUTH_STALE_S": "120"}) as agent:
        yield proxy, agent


def test_connection_resets_never_fail_a_request(deployment: Deployment, proxied) -> None:  # type: ignore[no-untyped-def]
    proxy, agent = proxied
    url = f"{agent.url}/v1/models"
    statuses = []
    for _ in range(40):
        proxy.reset()  # the agent's kept-alive authorize connection is now dead
        statuses.append(httpx.get(url, headers=_bearer(deployment.reader_token),
                                  timeout=10).status_code)
    assert statuses == [200] * 40


def test_an_outage_serves_recent_callers_and_503s_the_rest(deployment: Deployment,
                                                           proxied) -> None:  # type: ignore[no-untyped-def]
    proxy, agent = proxied
    model = f"{deployment.namespace}/a"
    newcomer = deployment.admin.token("newcomer", [{"namespace": deployment.namespace,
                                                    "role": "read"}])
    body = {"model": model, "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}
    seen = httpx.post(f"{agent.url}/v1/completions", json=body,
                      headers=_bearer(deployment.reader_token), timeout=60)
    assert seen.status_code == 200, seen.text
    proxy.down()
    try:
        time.sleep(0.2)
        stale = httpx.post(f"{agent.url}/v1/completions", json=body,
                           headers=_bearer(deployment.reader_token), timeout=60)
        assert stale.status_code == 200, stale.text
        assert stale.json()["adapterplane"]["alias"] == "a"
        refused = httpx.post(f"{agent.url}/v1/completions", json=body,
                             headers=_bearer(newcomer), timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.headers["content-type"].startswith("application/json")
        assert refused.json()["error"]["code"] == "CONTROL_PLANE_UNAVAILABLE"
        assert int(refused.headers["Retry-After"]) >= 1
    finally:
        proxy.up()
    deadline = time.monotonic() + 20
    while True:
        back = httpx.post(f"{agent.url}/v1/completions", json=body,
                          headers=_bearer(newcomer), timeout=60)
        if back.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert back.status_code == 200, back.text
