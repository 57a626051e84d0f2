"""HTTP client for the admin REST API (docs/API.md), on `httpx`.

`ApiClient` speaks JSON, sends `Authorization: Bearer <token>`, and turns every
non-2xx answer into an `ApiError` carrying the API's stable `code`; connection
failures and timeouts become `UNREACHABLE` (exit 7). A URL without `http://` or
`https://` is a usage error (exit 2) raised before any connection, and a 401 answered to
a client without a token says how to give one. Responses are returned exactly as decoded
from the API (dicts/lists), never re-shaped, so `--output json` is machine-readable in
the API's own schema.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from cli.errors import ApiError, usage_error

DEFAULT_URL = "http://127.0.0.1:8400"
URL_ENV = "ADAPTERPLANE_URL"
TOKEN_ENV = "ADAPTERPLANE_TOKEN"
DEFAULT_TIMEOUT_S = 30.0


def control_plane_url(url: str) -> str:
    """`url` without its trailing `/`; a usage error unless it is an http(s) URL with a host.

    httpx would read `localhost:8400` as scheme `localhost` and fail to connect, which
    reads as an unreachable server rather than a mistyped URL.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise usage_error(
            f"control-plane URL {url!r} needs http:// or https:// and a host "
            f"(e.g. {DEFAULT_URL}); set it with --url or {URL_ENV}"
        )
    return url.strip().rstrip("/")


def segment(value: str) -> str:
    """Percent-encode one path segment (namespace, alias, ref) so `/` cannot escape it."""
    return quote(value, safe=":")


class ApiClient:
    """A thin, synchronous client of the admin API. Use as a context manager.

    `base_url` is the server root (e.g. `http://127.0.0.1:8400`); `token` may be None
    for `/healthz` and `/readyz`. `transport` lets tests or embedders inject an httpx
    transport; the default is a real TCP connection pool.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = control_plane_url(base_url or os.environ.get(URL_ENV) or DEFAULT_URL)
        self.token = token if token is not None else os.environ.get(TOKEN_ENV)
        headers = {"Accept": "application/json", "User-Agent": "adapterctl/0.1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        files: Any = None,
        data: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON body (None for an empty body).

        Raises `ApiError` for any non-2xx answer or transport failure.
        """
        clean_params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(
                method,
                path,
                json=json,
                params=clean_params,
                files=files,
                data=data,
                headers=dict(headers or {}),
            )
        except httpx.TimeoutException as exc:
            raise ApiError("UNREACHABLE", f"{self.base_url}: timed out ({exc})") from exc
        except httpx.TransportError as exc:
            raise ApiError("UNREACHABLE", f"cannot reach {self.base_url}: {exc}") from exc
        if response.is_success:
            return response.json() if response.content else None
        raise _error_from(response, hint=self._auth_hint(response))

    def _auth_hint(self, response: httpx.Response) -> str | None:
        """How to give a token, for a 401 answered to a client that sent none."""
        if response.status_code == 401 and not self.token:
            return f"no token given: pass --token or set {TOKEN_ENV}"
        return None

    def get(self, path: str, *, params: Mapping[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, *, json: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        return self.request("POST", path, json=json, headers=headers)

    def patch(self, path: str, *, json: Any = None) -> Any:
        return self.request("PATCH", path, json=json)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def paginate(
        self, path: str, *, params: Mapping[str, Any] | None = None, follow: bool = False
    ) -> dict[str, Any]:
        """GET a keyset-paginated list `{"items", "next_cursor"}`.

        With `follow`, walks every page and returns one `{"items": all, "next_cursor": None}`.
        """
        page: dict[str, Any] = self.get(path, params=params)
        if not follow:
            return page
        items = list(page.get("items", []))
        cursor = page.get("next_cursor")
        while cursor:
            page = self.get(path, params={**(params or {}), "cursor": cursor})
            items.extend(page.get("items", []))
            cursor = page.get("next_cursor")
        return {"items": items, "next_cursor": None}


def _error_from(response: httpx.Response, *, hint: str | None = None) -> ApiError:
    """Build an ApiError from an error response, tolerating bodies not in our schema.

    `hint`, when given, is appended to the message in parentheses.
    """
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        message = str(body.get("error") or body.get("message") or response.reason_phrase)
        return ApiError(
            body["code"], _hinted(message, hint), status=status, detail=body.get("detail")
        )
    text = response.text.strip()[:500] or response.reason_phrase
    return ApiError(f"HTTP_{status}", _hinted(text, hint), status=status, detail=body)


def _hinted(message: str, hint: str | None) -> str:
    return f"{message} ({hint})" if hint else message
