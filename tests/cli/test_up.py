"""`adapterplane up`: the embedded stack (SQLite DB, file:// objects, SQLite-broker worker)
starts as real processes, answers /readyz, validates a push on its SQLite-broker worker,
and stops cleanly on Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.stack import STORE_ENV_VARS, free_port


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_serves_readyz_validates_and_stops_cleanly_on_ctrl_c(
    tmp_path: Path, cli_assets: Any
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in STORE_ENV_VARS}
    script = Path(sys.executable).with_name("adapterplane")
    proc = subprocess.Popen(
        [str(script), "up", "--data-dir", str(tmp_path), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # blocks until the stack is ready (or up exits)
        assert f"http://127.0.0.1:{port}" in banner, proc.stderr.read() if proc.stderr else ""
        url = f"http://127.0.0.1:{port}"
        ready = httpx.get(f"{url}/readyz", timeout=5)
        assert ready.status_code == 200
        assert ready.json()["status"] == "ready"
        token = (tmp_path / "admin.token").read_text().strip()
        assert oct((tmp_path / "admin.token").stat().st_mode & 0o777) == "0o600"
        listed = httpx.get(
            f"{url}/v1/namespaces", timeout=5, headers={"Authorization": f"Bearer {token}"}
        )
        assert listed.status_code == 200
        worker_pid = int((tmp_path / "run" / "worker.ready").read_text())

        # One push through the embedded worker (SQLite broker + result backend).
        runner = CliRunner()
        env_cli = {"ADAPTERPLANE_URL": url, "ADAPTERPLANE_TOKEN": token}

        def adapterctl(*args: str) -> Any:
            result = runner.invoke(app, ["-o", "json", *args], env=env_cli)
            assert result.exit_code == 0, result.output
            return json.loads(result.stdout)

        h_base = adapterctl("bases", "register", str(cli_assets.base), "--name", "tiny")["h_base"]
        adapterctl("namespaces", "create", "embedded")
        artifact = adapterctl(
            "push",
            str(cli_assets.adapter_a),
            "-n",
            "embedded",
            "-b",
            h_base,
            "--wait",
            "--timeout",
            "60",
        )
        assert artifact["state"] == "validated"
        assert (tmp_path / "adapterplane.db").is_file()
        assert (tmp_path / "celery-broker.db").is_file()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopped cleanly" in err
    assert not _pid_alive(worker_pid)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=2)
