"""The exit-code contract CI pipelines gate on (docs/CLI.md, "Errors and exit codes").

The expected values are the documented table, written out here independently of
`cli.errors`; a change to either must be deliberate.
"""

from __future__ import annotations

import pytest

from cli.errors import exit_code_for

DOCUMENTED = {
    "USAGE": 2,
    "NOT_FOUND": 3,
    "GENERATION_CONFLICT": 4,
    "ALREADY_EXISTS": 4,
    "INVALID_STATE": 4,
    "VALIDATION_ERROR": 5,
    "BASE_MISMATCH": 5,
    "IDEMPOTENCY_MISMATCH": 5,
    "FORBIDDEN_FILE": 5,
    "MISSING_FILE": 5,
    "ARTIFACT_TOO_LARGE": 5,
    "non_finite": 5,
    "pickle_weights": 5,
    "UNAUTHENTICATED": 6,
    "FORBIDDEN": 6,
    "STORAGE_ERROR": 7,
    "UNREACHABLE": 7,
    "ALIAS_RETIRED": 8,
    "WAIT_TIMEOUT": 9,
}


@pytest.mark.parametrize(("code", "expected"), sorted(DOCUMENTED.items()))
def test_documented_codes(code: str, expected: int) -> None:
    assert exit_code_for(code) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, 5),
        (401, 6),
        (403, 6),
        (404, 3),
        (405, 5),
        (409, 4),
        (410, 8),
        (413, 5),
        (422, 5),
        (500, 7),
        (502, 7),
        (503, 7),
    ],
)
def test_unknown_codes_fall_back_on_the_http_status(status: int, expected: int) -> None:
    assert exit_code_for(f"HTTP_{status}", status) == expected
    assert exit_code_for("SOME_NEW_CODE", status) == expected


def test_a_known_code_wins_over_its_status() -> None:
    assert exit_code_for("INVALID_STATE", 422) == 4
    assert exit_code_for("STORAGE_ERROR", 502) == 7
