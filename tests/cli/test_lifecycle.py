"""adapterctl end to end: push -> validate (real worker) -> publish -> resolve -> retire
-> 410 -> rollback -> history, over real HTTP against a real API server."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from typer.testing import Result

Invoke = Callable[..., Result]
PushWait = Callable[[str], Result]
"""tests/cli/conftest.py's `push_wait`: push SOURCE into the test namespace with --wait."""
CliAssets = Any
"""tests/cli/conftest.py's CliAssets (base, adapter_a, adapter_b, adapter_nan)."""


def ok_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_push_publish_retire_rollback_history(
    adapterctl: Invoke, cli_assets: CliAssets, h_base: str, namespace: str, push_wait: PushWait
) -> None:
    a = ok_json(push_wait(str(cli_assets.adapter_a)))
    b = ok_json(push_wait(str(cli_assets.adapter_b)))
    assert (a["state"], b["state"]) == ("validated", "validated")
    assert a["namespace"] == namespace and a["base"] == h_base
    assert a["digest"] and b["digest"] and a["digest"] != b["digest"]

    # The same bytes pushed again are the same artifact.
    again = ok_json(push_wait(str(cli_assets.adapter_a)))
    assert again["id"] == a["id"]

    ref = f"{namespace}/bot"
    g1 = ok_json(
        adapterctl(
            "-o",
            "json",
            "publish",
            ref,
            str(a["id"]),
            "--reason",
            "v1",
            "--expected-generation",
            "0",
        )
    )
    assert (g1["generation"], g1["action"], g1["artifact"]["id"]) == (1, "publish", a["id"])
    resolved = ok_json(adapterctl("-o", "json", "resolve", ref))
    assert (resolved["generation"], resolved["artifact"]["id"]) == (1, a["id"])
    assert resolved["base"] == h_base

    # Publish by content digest with compare-and-swap on the current generation.
    g2 = ok_json(
        adapterctl(
            "-o", "json", "publish", ref, f"sha256:{b['digest']}", "--expected-generation", "1"
        )
    )
    assert (g2["generation"], g2["artifact"]["id"]) == (2, b["id"])

    g3 = ok_json(adapterctl("-o", "json", "retire", ref, "--reason", "incident"))
    assert (g3["generation"], g3["action"], g3["artifact"]) == (3, "retire", None)
    gone = adapterctl("resolve", ref)
    assert gone.exit_code == 8
    assert gone.stderr.startswith("error: ALIAS_RETIRED: ")
    assert gone.stdout == ""

    g4 = ok_json(adapterctl("-o", "json", "rollback", ref, "--to-generation", "1"))
    assert (g4["generation"], g4["action"], g4["artifact"]["id"]) == (4, "rollback", a["id"])
    assert ok_json(adapterctl("-o", "json", "resolve", ref))["artifact"]["id"] == a["id"]

    history = ok_json(adapterctl("-o", "json", "history", ref))
    assert [g["generation"] for g in history["items"]] == [4, 3, 2, 1]
    assert [g["action"] for g in history["items"]] == ["rollback", "retire", "publish", "publish"]
    assert history["next_cursor"] is None
    paged = ok_json(adapterctl("-o", "json", "history", ref, "--limit", "3", "--all"))
    assert paged["items"] == history["items"]
    # Without --all: one page, and the cursor it hands out continues exactly after it.
    first = ok_json(adapterctl("-o", "json", "history", ref, "--limit", "3"))
    assert first["items"] == history["items"][:3] and first["next_cursor"]
    rest = ok_json(
        adapterctl("-o", "json", "history", ref, "--limit", "3", "--cursor", first["next_cursor"])
    )
    assert (rest["items"], rest["next_cursor"]) == (history["items"][3:], None)
    hinted = adapterctl("history", ref, "--limit", "3")
    assert f"more: --cursor {first['next_cursor']}" in hinted.stderr

    # Table output is for humans but carries the same facts.
    table = adapterctl("history", ref)
    assert table.exit_code == 0, table.output
    for word in ("rollback", "retire", "publish", "incident"):
        assert word in table.stdout

    listed = ok_json(
        adapterctl("-o", "json", "artifacts", "list", namespace, "--state", "validated")
    )
    assert {item["id"] for item in listed["items"]} == {a["id"], b["id"]}
    shown = ok_json(adapterctl("-o", "json", "artifacts", "show", namespace, str(b["id"])))
    assert shown == {**shown, "id": b["id"], "digest": b["digest"]}
    aliases = ok_json(adapterctl("-o", "json", "aliases", namespace))
    assert [(x["alias"], x["generation"]) for x in aliases["items"]] == [("bot", 4)]

    audit = ok_json(adapterctl("-o", "json", "audit", "--namespace", namespace))
    actions = [entry["action"] for entry in audit["items"]]
    assert len(actions) >= 4


def test_idempotency_key_returns_the_original_generation(
    adapterctl: Invoke, cli_assets: CliAssets, namespace: str, push_wait: PushWait
) -> None:
    a = ok_json(push_wait(str(cli_assets.adapter_a)))
    b = ok_json(push_wait(str(cli_assets.adapter_b)))
    ref = f"{namespace}/idem"
    first = ok_json(
        adapterctl("-o", "json", "publish", ref, str(a["id"]), "--idempotency-key", "k-1")
    )
    repeat = ok_json(
        adapterctl("-o", "json", "publish", ref, str(a["id"]), "--idempotency-key", "k-1")
    )
    assert repeat["generation"] == first["generation"] == 1
    clash = adapterctl("publish", ref, str(b["id"]), "--idempotency-key", "k-1")
    assert clash.exit_code == 5
    assert clash.stderr.startswith("error: IDEMPOTENCY_MISMATCH: ")
    history = ok_json(adapterctl("-o", "json", "history", ref))
    assert [g["generation"] for g in history["items"]] == [1]


def test_push_by_base_name_and_table_output(
    adapterctl: Invoke, cli_assets: CliAssets, h_base: str, namespace: str
) -> None:
    base = ok_json(adapterctl("-o", "json", "bases", "show", h_base))
    pushed = adapterctl(
        "push", str(cli_assets.adapter_b), "-n", namespace, "-b", base["name"], "--wait"
    )
    assert pushed.exit_code == 0, pushed.output
    assert "validated" in pushed.stdout and "state: validated" in pushed.stderr
    listed = ok_json(adapterctl("-o", "json", "artifacts", "list", namespace))
    assert [item["base"] for item in listed["items"]] == [h_base]
    unknown = adapterctl(
        "push", str(cli_assets.adapter_b), "-n", namespace, "-b", "no-such-base-name"
    )
    assert unknown.exit_code == 3
    assert unknown.stderr.startswith("error: NOT_FOUND: ")
