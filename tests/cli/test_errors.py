"""adapterctl failure modes: `error: <CODE>: <message>` on stderr and stable exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import Result

from cli.stack import EmbeddedStack, free_port

Invoke = Callable[..., Result]
PushWait = Callable[[str], Result]
"""tests/cli/conftest.py's `push_wait`: push SOURCE into the test namespace with --wait."""
CliAssets = Any
"""tests/cli/conftest.py's CliAssets (base, adapter_a, adapter_b, adapter_nan)."""


def test_generation_conflict_exits_4_and_changes_nothing(
    adapterctl: Invoke, cli_assets: CliAssets, namespace: str, push_wait: PushWait
) -> None:
    pushed = push_wait(str(cli_assets.adapter_a))
    artifact = json.loads(pushed.stdout)
    ref = f"{namespace}/cas"
    assert adapterctl("publish", ref, str(artifact["id"])).exit_code == 0
    stale = adapterctl("publish", ref, str(artifact["id"]), "--expected-generation", "0")
    assert stale.exit_code == 4
    assert stale.stderr.startswith("error: GENERATION_CONFLICT: ")
    history = json.loads(adapterctl("-o", "json", "history", ref).stdout)
    assert [g["generation"] for g in history["items"]] == [1]


def test_not_found_exits_3(adapterctl: Invoke, namespace: str) -> None:
    missing = adapterctl("resolve", f"{namespace}/never-published")
    assert missing.exit_code == 3
    assert missing.stderr.startswith("error: NOT_FOUND: ")
    assert adapterctl("artifacts", "show", namespace, "999999999").exit_code == 3


def test_rejected_artifact_exits_5_with_its_rejection_code(
    adapterctl: Invoke, cli_assets: CliAssets, namespace: str, push_wait: PushWait
) -> None:
    result = push_wait(str(cli_assets.adapter_nan))
    assert result.exit_code == 5, result.output
    artifact = json.loads(result.stdout)
    assert artifact["state"] == "rejected"
    code = artifact["rejection"]["code"]
    assert code == code.lower() and code  # the API's value, unchanged in -o json
    # printed upper-case like every other code (`error: NON_FINITE: ...`)
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {code.upper()}: ")
    shown = adapterctl("artifacts", "show", namespace, str(artifact["id"]))
    assert f"{code.upper()}: " in shown.stdout and f"{code}: " not in shown.stdout
    # A rejected artifact cannot be published: 409 INVALID_STATE.
    refused = adapterctl("publish", f"{namespace}/bad", str(artifact["id"]))
    assert refused.exit_code == 4
    assert refused.stderr.startswith("error: INVALID_STATE: ")


def test_scopes_forbid_and_bad_tokens_are_unauthenticated(
    adapterctl: Invoke, cli_assets: CliAssets, h_base: str, namespace: str
) -> None:
    created = adapterctl(
        "-o", "json", "tokens", "create", "--name", "reader", "--grant", f"{namespace}:read"
    )
    assert created.exit_code == 0, created.output
    reader = json.loads(created.stdout)["token"]
    pushed = adapterctl(
        "push", str(cli_assets.adapter_a), "-n", namespace, "-b", h_base, token=reader
    )
    assert pushed.exit_code == 6
    assert pushed.stderr.startswith("error: FORBIDDEN: ")
    assert adapterctl("resolve", f"{namespace}/x", token=reader).exit_code == 3
    other = adapterctl("artifacts", "list", "some-other-namespace", token=reader)
    assert other.exit_code == 6
    bogus = adapterctl("bases", "list", token="not-a-token")
    assert bogus.exit_code == 6
    assert bogus.stderr.startswith("error: UNAUTHENTICATED: ")

    token_id = json.loads(created.stdout)["id"]
    revoked = adapterctl("-o", "json", "tokens", "revoke", str(token_id))
    assert revoked.exit_code == 0, revoked.output
    assert json.loads(revoked.stdout)["revoked"] is True
    after = adapterctl("resolve", f"{namespace}/x", token=reader)
    assert after.exit_code == 6
    assert after.stderr.startswith("error: UNAUTHENTICATED: ")


def test_usage_errors_exit_2_without_a_request(adapterctl: Invoke, tmp_path: Path) -> None:
    assert adapterctl("resolve", "no-slash").exit_code == 2
    result = adapterctl("push", str(tmp_path / "absent"), "-n", "ns", "-b", "0" * 64)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: USAGE: ")
    assert adapterctl("tokens", "create", "--name", "x", "--grant", "ns:owner").exit_code == 2


def test_console_script_exit_code_and_unreachable_server(control_plane: EmbeddedStack) -> None:
    """The installed `adapterctl` script itself (a subprocess) maps errors to exit codes."""
    script = Path(sys.executable).with_name("adapterctl")
    env = {
        **os.environ,
        "ADAPTERPLANE_URL": control_plane.url,
        "ADAPTERPLANE_TOKEN": control_plane.token(),
    }
    found = subprocess.run(
        [str(script), "-o", "json", "bases", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert isinstance(json.loads(found.stdout)["items"], list)
    env["ADAPTERPLANE_URL"] = f"http://127.0.0.1:{free_port()}"
    down = subprocess.run(
        [str(script), "bases", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 7
    assert down.stderr.startswith("error: UNREACHABLE: ")
