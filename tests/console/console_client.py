"""A console session over plain HTTP, logged in through the real login form."""

from __future__ import annotations

import re

import httpx

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def login(url: str, token: str) -> httpx.Client:
    """A client holding a console session for `token` (through the login form)."""
    client = httpx.Client(base_url=url, timeout=10)
    form = client.get("/ui/login")
    assert form.status_code == 200
    csrf = CSRF.search(form.text)
    assert csrf is not None
    answer = client.post("/ui/login", data={"token": token, "csrf": csrf.group(1),
                                            "next": "/ui/agents"})
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/ui/agents"
    return client


def csrf_of(page: httpx.Response) -> str:
    found = CSRF.search(page.text)
    assert found is not None, page.text
    return found.group(1)
