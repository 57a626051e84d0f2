"""What a new user hits first: URL and token mistakes, empty lists, help and completion."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings
from typer.testing import CliRunner, Result

from agent.config import settings_usage
from cli import demo, launcher, output
from cli.main import app

Invoke = Callable[..., Result]


@pytest.mark.parametrize("url", ["localhost:8400", "127.0.0.1:8400", "ftp://example.org"])
def test_url_without_http_scheme_is_a_usage_error(url: str) -> None:
    for args, env in (
        (["--url", url, "bases", "list"], {}),
        (["bases", "list"], {"ADAPTERPLANE_URL": url}),
    ):
        result = CliRunner().invoke(app, args, env={"ADAPTERPLANE_TOKEN": "x", **env})
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: USAGE: ")
        assert "http:// or https://" in result.stderr
        assert result.stdout == ""


def test_missing_token_says_how_to_give_one(adapterctl: Invoke) -> None:
    result = adapterctl("bases", "list", token="")
    assert result.exit_code == 6
    assert result.stderr.startswith("error: UNAUTHENTICATED: ")
    assert "--token" in result.stderr and "ADAPTERPLANE_TOKEN" in result.stderr
    # A token that was given but is wrong needs no such hint.
    bogus = adapterctl("bases", "list", token="not-a-token")
    assert bogus.exit_code == 6
    assert "--token" not in bogus.stderr


def _setting_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  --")]


def test_agent_help_prints_real_defaults_in_aligned_columns() -> None:
    result = CliRunner().invoke(launcher.app, ["agent", "--help"])
    assert result.exit_code == 0, result.output
    assert "PydanticUndefined" not in result.stdout
    lines = _setting_lines(result.stdout)
    assert any(line.startswith("  --adapter-targets=[] ") for line in lines)
    assert any(line.startswith("  --port=8500 ") for line in lines)
    assert any(line.startswith("  --max-tokens-limit=(unset) ") for line in lines)
    starts = {re.match(r"  --\S+\s+", line).end() for line in lines}  # type: ignore[union-attr]
    assert len(starts) == 1, "every description starts at one column"


def test_agent_help_marks_settings_without_default_required() -> None:
    class Example(BaseSettings):
        model_dir: str = Field(description="Where the model is.")
        port: int = 1

    lines = _setting_lines(settings_usage(Example))
    assert lines == ["  --model-dir=(required)  Where the model is.", "  --port=1"]


def test_empty_lists_say_so_in_table_mode(adapterctl: Invoke, namespace: str) -> None:
    aliases = adapterctl("aliases", namespace)
    assert aliases.exit_code == 0, aliases.output
    assert aliases.stdout == ""
    assert aliases.stderr.strip() == "no aliases published"
    artifacts = adapterctl("artifacts", "list", namespace)
    assert artifacts.stderr.strip() == "no artifacts"
    as_json = adapterctl("-o", "json", "aliases", namespace)
    assert as_json.stderr == ""
    assert '"items": []' in as_json.stdout


def test_empty_base_registry_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    output.render_bases({"items": [], "next_cursor": None})
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "no base models registered"


@pytest.mark.parametrize(
    ("application", "prog"), [(app, "adapterctl"), (launcher.app, "adapterplane")]
)
def test_shell_completion_is_available(application: object, prog: str) -> None:
    runner = CliRunner()
    helped = runner.invoke(application, ["--help"], prog_name=prog)  # type: ignore[arg-type]
    assert "--install-completion" in helped.stdout and "--show-completion" in helped.stdout
    script = runner.invoke(
        application, ["--show-completion", "bash"], prog_name=prog  # type: ignore[arg-type]
    )
    assert script.exit_code == 0, script.output
    assert f"_{prog.upper()}_COMPLETE=complete_bash" in script.stdout


def _bad_adapter_dirs(root: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """Directories the server refuses, each with the code it refuses them with."""
    config, weights = (good / "adapter_config.json"), (good / "adapter_model.safetensors")
    made: dict[str, tuple[Path, str]] = {}
    for name, files, code in (
        ("pickle-beside", {"adapter_config.json": config.read_bytes(),
                           "adapter_model.safetensors": weights.read_bytes(),
                           "adapter_model.bin": b"\x80\x04pickle"}, "FORBIDDEN_FILE"),
        ("pickle-only", {"adapter_config.json": config.read_bytes(),
                         "adapter_model.bin": b"\x80\x04pickle"}, "FORBIDDEN_FILE"),
        ("no-config", {"adapter_model.safetensors": weights.read_bytes()}, "MISSING_FILE"),
        ("empty", {}, "MISSING_FILE"),
    ):
        directory = root / name
        directory.mkdir()
        for file, data in files.items():
            (directory / file).write_bytes(data)
        made[name] = (directory, code)
    return made


def test_a_bad_adapter_gets_one_code_pushed_locally_or_through_file_uri(
        adapterctl: Invoke, cli_assets: Any, h_base: str, namespace: str,
        tmp_path: Path) -> None:
    for name, (directory, code) in _bad_adapter_dirs(tmp_path, cli_assets.adapter_a).items():
        for source in (str(directory), directory.resolve().as_uri()):
            result = adapterctl("push", source, "-n", namespace, "-b", h_base)
            assert (result.exit_code, result.stdout) == (5, ""), (name, source, result.output)
            assert result.stderr.startswith(f"error: {code}: "), (name, source, result.stderr)
    listed = adapterctl("-o", "json", "artifacts", "list", namespace)
    assert '"items": []' in listed.stdout  # nothing was stored


def test_demo_lines_are_not_wrapped_nor_read_as_markup(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    line = ("demo/support-bot: generation 3 -> ' Paris.Paris.Paris.Paris.Paris.Paris.Paris."
            "Paris. [b]The capital of France is Paris'")
    demo.Narrator().info(line)
    assert capsys.readouterr().out == line + "\n"
