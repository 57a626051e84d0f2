"""What a new user hits first: URL and token mistakes, empty lists, help and completion."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings
from typer.testing import CliRunner, Result

from agent.config import settings_usage
from cli import launcher, output
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
