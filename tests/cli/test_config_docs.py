"""docs/CONFIG.md is what `cli.config_docs.render()` writes from the settings classes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from cli import config_docs

DOC = config_docs.ROOT / config_docs.DOC_PATH


def test_config_md_is_up_to_date() -> None:
    current = DOC.read_text() if DOC.is_file() else ""
    assert current == config_docs.render(), (
        f"docs/CONFIG.md is out of date; regenerate it with `{config_docs.REGENERATE}`")


def test_fields_documented_and_variables_registered() -> None:
    assert config_docs.registry_problems() == []


def test_render_ignores_environment_and_cwd(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    expected = config_docs.render()
    monkeypatch.setenv("ADAPTERPLANE_DATA_DIR", "/elsewhere")
    monkeypatch.setenv("ADAPTERPLANE_AGENT_TOKEN", "not-to-be-printed")
    monkeypatch.setenv("ADAPTERPLANE_S3_SECRET_ACCESS_KEY", "also-secret")
    monkeypatch.chdir(tmp_path)
    text = config_docs.render()
    assert text == expected
    assert "not-to-be-printed" not in text and "also-secret" not in text


class _Example(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EXAMPLE_", use_attribute_docstrings=True)

    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    """Machine-dependent factory."""
    workdir: Path = Path.cwd() / "var"
    """Machine-dependent path."""
    chunk: int = Field(default=8 * 1024 * 1024, gt=0)
    """Constant arithmetic."""
    password: SecretStr = SecretStr("hunter2")
    """A secret."""
    tags: list[str] = Field(default_factory=list)
    """A list | with a pipe."""


def test_machine_dependent_defaults_render_as_written() -> None:
    text = config_docs.render_section(config_docs.Section("Example", _Example, "Intro."))
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines()
            if line.startswith("| `EXAMPLE_")}
    assert "`os.cpu_count() or 1`" in rows["EXAMPLE_WORKERS"] and "≥ 1" in rows["EXAMPLE_WORKERS"]
    assert "`Path.cwd() / 'var'`" in rows["EXAMPLE_WORKDIR"]
    assert str(Path.cwd()) not in text
    assert "`8388608` (8 MiB)" in rows["EXAMPLE_CHUNK"]
    assert "(secret)" in rows["EXAMPLE_PASSWORD"] and "hunter2" not in text
    assert "| list of str (JSON) | `[]` | A list \\| with a pipe. |" in rows["EXAMPLE_TAGS"]


def test_check_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "CONFIG.md"
    stale.write_text(config_docs.render().replace("Region of the S3 client.", "Region."))
    assert config_docs.main(["--check", "--path", str(stale)]) == 1
    err = capsys.readouterr().err
    assert "out of date" in err and config_docs.REGENERATE in err
    assert "+| `ADAPTERPLANE_S3_REGION`" in err
    assert config_docs.main(["--path", str(stale)]) == 0
    assert config_docs.main(["--check", "--path", str(stale)]) == 0
