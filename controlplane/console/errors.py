"""The console's own refusals, in the API's one error hierarchy (controlplane/errors.py)."""

from __future__ import annotations

from controlplane.errors import AdapterplaneError


class CsrfRejected(AdapterplaneError):
    """A console form arrived without the CSRF token of the session that rendered it
    (a forged cross-site POST, or a form rendered before a logout): nothing changes."""

    status_code = 403
    code = "CSRF_REJECTED"
