"""Progress of `push` uploads and `--wait`: shown to a person at a terminal, never in a
CI log (stderr not a terminal) nor with `-o json`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from on_terminal import PROGRESS_BAR, adapterctl_on_terminal
from typer.testing import Result

from cli.stack import EmbeddedStack

Invoke = Callable[..., Result]
CliAssets = Any
"""tests/cli/conftest.py's CliAssets (base, adapter_a, adapter_b, adapter_nan)."""


def test_push_on_a_terminal_shows_the_upload_and_the_wait(
        control_plane: EmbeddedStack, cli_assets: CliAssets, h_base: str,
        namespace: str) -> None:
    run = adapterctl_on_terminal(control_plane.url, control_plane.token(), "push",
                                 str(cli_assets.adapter_b), "-n", namespace, "-b", h_base,
                                 "--wait", "--timeout", "60")
    assert run.returncode == 0, run.terminal
    assert "upload adapter_model.safetensors" in run.terminal
    assert "upload adapter_config.json" in run.terminal
    assert PROGRESS_BAR in run.terminal
    size = (cli_assets.adapter_b / "adapter_model.safetensors").stat().st_size
    assert 1000 <= size < 1_000_000
    kb = f"{size / 1000:.1f}"
    assert f"{kb}/{kb} kB" in run.terminal  # the bar reached the file's size
    assert "state: validated" in run.terminal
    assert "validated" in run.stdout and "\x1b" not in run.stdout  # stdout is a pipe


def test_json_output_on_a_terminal_shows_no_progress(
        control_plane: EmbeddedStack, cli_assets: CliAssets, h_base: str,
        namespace: str) -> None:
    run = adapterctl_on_terminal(control_plane.url, control_plane.token(), "-o", "json",
                                 "push", str(cli_assets.adapter_b), "-n", namespace,
                                 "-b", h_base, "--wait", "--timeout", "60")
    assert run.returncode == 0, run.terminal
    assert json.loads(run.stdout)["state"] == "validated"
    assert "upload" not in run.terminal and PROGRESS_BAR not in run.terminal
    assert "\x1b" not in run.terminal


def test_no_progress_when_stderr_is_not_a_terminal(
        adapterctl: Invoke, cli_assets: CliAssets, h_base: str, namespace: str) -> None:
    pushed = adapterctl("push", str(cli_assets.adapter_b), "-n", namespace, "-b", h_base,
                        "--wait", "--timeout", "60")
    assert pushed.exit_code == 0, pushed.output
    assert "upload" not in pushed.stderr and PROGRESS_BAR not in pushed.stderr
    assert "\x1b" not in pushed.stderr
    assert "state: validated" in pushed.stderr  # the plain lines stay
