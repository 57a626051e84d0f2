"""`adapterctl namespaces set-weight|set-priority|list` against the real control plane:
the API's answer (json) or a table, the stable exit codes of refusals, and the audit row
of each change."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from typer.testing import Result

Invoke = Callable[..., Result]


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _listed(adapterctl: Invoke, name: str) -> dict[str, Any]:
    page = ok_json(adapterctl("-o", "json", "namespaces", "list", "--all"))
    (row,) = [n for n in page["items"] if n["name"] == name]
    return dict(row)


def test_set_weight_and_priority(adapterctl: Invoke, namespace: str) -> None:
    fresh = _listed(adapterctl, namespace)
    assert (fresh["weight"], fresh["priority"]) == (1.0, "normal")

    out = ok_json(adapterctl("-o", "json", "namespaces", "set-weight", namespace, "2.5"))
    assert (out["name"], out["weight"], out["priority"]) == (namespace, 2.5, "normal")
    out = ok_json(adapterctl("-o", "json", "namespaces", "set-priority", namespace, "HIGH"))
    assert (out["weight"], out["priority"]) == (2.5, "high")
    assert ok_json(adapterctl("-o", "json", "namespaces", "set-weight", namespace,
                              "1000"))["weight"] == 1000.0
    listed = _listed(adapterctl, namespace)
    assert (listed["weight"], listed["priority"]) == (1000.0, "high")

    table = adapterctl("namespaces", "set-priority", namespace, "low")
    assert table.exit_code == 0, table.output
    assert "priority" in table.stdout and "low" in table.stdout
    listing = adapterctl("namespaces", "list", "--all")
    assert listing.exit_code == 0, listing.output
    header = next(line for line in listing.stdout.splitlines() if "created" in line)
    assert "weight" in header and "priority" in header
    row = next(line for line in listing.stdout.splitlines() if namespace in line)
    assert "1000.0" in row and "low" in row

    audit = ok_json(adapterctl("-o", "json", "audit", "--namespace", namespace))
    changes = [e["detail"]["after"] for e in audit["items"] if e["action"] == "namespace.update"]
    assert changes == [{"weight": 1000.0, "priority": "low"},
                       {"weight": 1000.0, "priority": "high"},
                       {"weight": 2.5, "priority": "high"},
                       {"weight": 2.5, "priority": "normal"}]


def test_refusals_exit_with_stable_codes_and_change_nothing(adapterctl: Invoke,
                                                            namespace: str) -> None:
    assert adapterctl("namespaces", "set-weight", namespace, "3").exit_code == 0
    before = _listed(adapterctl, namespace)
    for weight in ("0", "1000.5", "1e9"):
        refused = adapterctl("namespaces", "set-weight", namespace, weight)
        assert refused.exit_code == 5, (weight, refused.output)
        assert refused.stderr.startswith("error: VALIDATION_ERROR: invalid request: weight: ")
    # a negative number after `--` (else it reads as an option)
    negative = adapterctl("namespaces", "set-weight", "--", namespace, "-2")
    assert negative.exit_code == 5, negative.output
    assert "greater than 0" in negative.stderr
    for weight in ("nan", "inf", "heavy"):  # not a finite number: refused before sending
        assert adapterctl("namespaces", "set-weight", namespace, weight).exit_code == 2
    assert adapterctl("namespaces", "set-priority", namespace, "urgent").exit_code == 2

    missing = adapterctl("namespaces", "set-weight", "no-such-namespace", "2")
    assert missing.exit_code == 3 and missing.stderr.startswith("error: NOT_FOUND: ")
    missing = adapterctl("namespaces", "set-priority", "no-such-namespace", "high")
    assert missing.exit_code == 3

    grant = f"{namespace}:admin"  # namespace admin: still not allowed to set its share
    ns_admin = ok_json(adapterctl("-o", "json", "tokens", "create", "--name", "ns-admin",
                                  "--grant", grant))["token"]
    denied = adapterctl("namespaces", "set-weight", namespace, "9", token=ns_admin)
    assert denied.exit_code == 6 and denied.stderr.startswith("error: FORBIDDEN: ")
    assert adapterctl("namespaces", "set-priority", namespace, "high",
                      token=ns_admin).exit_code == 6
    assert _listed(adapterctl, namespace) == before
