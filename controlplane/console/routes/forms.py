"""Reading console forms: the session's CSRF check first, then typed fields.

A form is parsed only after the session cookie authenticated (the route's principal
dependency) and its CSRF token matched, so a forged POST changes nothing and learns
nothing. Field errors are 422 VALIDATION_ERROR with the field named.
"""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import FormData

from controlplane.console.session import require_csrf
from controlplane.errors import BadRequest

MAX_FIELD_CHARS = 4000


async def checked_form(request: Request) -> FormData:
    """The form of a session's POST, after its CSRF token was checked."""
    form = await request.form(max_files=0, max_fields=20)
    require_csrf(request, form.get("csrf"))
    return form


def text_field(form: FormData, name: str) -> str | None:
    """The field's text, stripped; None when absent or empty."""
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
        raise BadRequest(f"invalid {name}", detail={"field": name})
    return value.strip() or None


def int_field(form: FormData, name: str) -> int | None:
    value = text_field(form, name)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise BadRequest(f"invalid {name}: expected a whole number, got {value!r}",
                         detail={"field": name, "value": value})
    return int(value)
