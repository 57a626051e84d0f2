"""`adapterplane up`: the embedded stack (SQLite DB, file:// objects, SQLite-broker worker)
starts as real processes, answers /readyz, and stops cleanly on Ctrl-C (SIGINT)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cli.stack import STORE_ENV_VARS, free_port


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_serves_readyz_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in STORE_ENV_VARS}
    script = Path(sys.executable).with_name("adapterplane")
    proc = subprocess.Popen(
        [str(script), "up", "--data-dir", str(tmp_path), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
        listed = httpx.get(f"{url}/v1/namespaces", timeout=5,
                           headers={"Authorization": f"Bearer {token}"})
        assert listed.status_code == 200
        worker_pid = int((tmp_path / "run" / "worker.ready").read_text())
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
