"""`adapterctl set-hot NS/ALIAS [--off]` against the real control plane: the alias's
resolution with its mark (json) or as fields, `aliases` showing it, the audit row of each
change, and the stable exit codes of refusals."""

from __future__ import annotations

from typing import Any

from test_lifecycle import CliAssets, Invoke, PushWait, ok_json


def _published(adapterctl: Invoke, push_wait: PushWait, cli_assets: CliAssets,
               namespace: str) -> tuple[str, dict[str, Any]]:
    artifact = ok_json(push_wait(str(cli_assets.adapter_a)))
    ref = f"{namespace}/bot"
    ok_json(adapterctl("-o", "json", "publish", ref, str(artifact["id"])))
    return ref, artifact


def test_set_hot_and_off(adapterctl: Invoke, push_wait: PushWait,
                         cli_assets: CliAssets, namespace: str) -> None:
    ref, artifact = _published(adapterctl, push_wait, cli_assets, namespace)
    assert ok_json(adapterctl("-o", "json", "resolve", ref))["hot"] is False

    out = ok_json(adapterctl("-o", "json", "set-hot", ref))
    assert (out["namespace"], out["alias"], out["hot"]) == (namespace, "bot", True)
    assert (out["generation"], out["artifact"]["id"]) == (1, artifact["id"])
    assert ok_json(adapterctl("-o", "json", "resolve", ref))["hot"] is True
    (row,) = ok_json(adapterctl("-o", "json", "aliases", namespace))["items"]
    assert row["hot"] is True

    fields = adapterctl("set-hot", ref, "--off")  # the human rendering
    assert fields.exit_code == 0, fields.output
    line = next(ln for ln in fields.stdout.splitlines() if ln.split()[:1] == ["hot"])
    assert line.split() == ["hot", "False"]
    assert ok_json(adapterctl("-o", "json", "resolve", ref))["hot"] is False
    listing = adapterctl("aliases", namespace)
    assert listing.exit_code == 0, listing.output
    header = next(ln for ln in listing.stdout.splitlines() if "updated" in ln)
    assert "hot" in header

    audit = ok_json(adapterctl("-o", "json", "audit", "--namespace", namespace))
    changes = [e["detail"] for e in audit["items"] if e["action"] == "alias.hot"]
    assert changes == [{"before": True, "after": False}, {"before": False, "after": True}]


def test_refusals_exit_with_stable_codes(adapterctl: Invoke, push_wait: PushWait,
                                         cli_assets: CliAssets, namespace: str) -> None:
    ref, _ = _published(adapterctl, push_wait, cli_assets, namespace)
    missing = adapterctl("set-hot", f"{namespace}/nowhere")
    assert missing.exit_code == 3 and missing.stderr.startswith("error: NOT_FOUND: ")
    assert adapterctl("set-hot", "no-such-namespace/bot", "--off").exit_code == 3
    assert adapterctl("set-hot", "no-slash").exit_code == 2  # malformed: nothing sent

    ns_admin = ok_json(adapterctl("-o", "json", "tokens", "create", "--name", "ns-admin",
                                  "--grant", f"{namespace}:admin"))["token"]
    denied = adapterctl("set-hot", ref, token=ns_admin)
    assert denied.exit_code == 6 and denied.stderr.startswith("error: FORBIDDEN: ")
    assert ok_json(adapterctl("-o", "json", "resolve", ref))["hot"] is False
