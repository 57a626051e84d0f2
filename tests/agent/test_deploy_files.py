"""deploy/: the agent's example environment file names real settings with valid values
(the settings ignore unknown variables, so a misspelt key would be silently dropped), and
the systemd template starts the agent with it."""

from __future__ import annotations

import configparser
from pathlib import Path

from agent.config import AgentSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PREFIX = "ADAPTERPLANE_AGENT_"


def _env(path: Path, *, uncomment: bool) -> dict[str, str]:
    """KEY=value lines (systemd EnvironmentFile syntax); `uncomment` also takes the
    commented-out `# ADAPTERPLANE_AGENT_...=...` examples."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if uncomment and line.startswith(f"# {PREFIX}"):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and "#" not in value, f"{raw!r}: systemd keeps a trailing # in the value"
        out[key] = value
    return out


def test_agent_env_example_names_real_settings() -> None:
    env = _env(DEPLOY / "agent.env.example", uncomment=True)
    assert env["ADAPTERPLANE_AGENT_TP_DEGREE"] == "2"  # the commented TP example is there
    fields = AgentSettings.model_fields
    values = {}
    for key, value in env.items():
        assert key.startswith(PREFIX), key
        name = key[len(PREFIX):].lower()
        assert name in fields, f"{key} is not an agent setting"
        values[name] = value
    settings = AgentSettings.model_validate(values)  # types and bounds
    assert settings.tp_degree == 2
    assert settings.device == "cuda:0"


def test_agent_unit_runs_the_agent_with_its_instance_env() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(DEPLOY / "systemd" / "adapterplane-agent@.service")
    service = unit["Service"]
    assert service["EnvironmentFile"] == "/etc/adapterplane/agent-%i.env"
    assert service["ExecStart"].endswith("/adapterplane agent")
    assert service["KillMode"] == "control-group"  # TP followers stop with the agent
