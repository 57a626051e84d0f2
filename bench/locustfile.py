"""The mixed load profile run by `bench/load_profile.py` (locust, headless).

Registry users (closed loop, no think time) resolve aliases, read their histories and
push an adapter (the same bytes: the idempotent path, which re-verifies the stored
blobs); completion users send short greedy completions to an agent. Everything the
users need comes from `LOAD_*` environment variables the runner sets.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from locust import FastHttpUser, constant, task
from urllib3 import encode_multipart_formdata

CP_URL = os.environ.get("LOAD_CP_URL", "http://127.0.0.1:8400")
AGENT_URL = os.environ.get("LOAD_AGENT_URL", "http://127.0.0.1:8500")
NAMESPACE = os.environ.get("LOAD_NAMESPACE", "load")
ALIASES = json.loads(os.environ.get("LOAD_ALIASES", "[]"))
ADMIN = {"Authorization": f"Bearer {os.environ.get('LOAD_ADMIN_TOKEN', '')}"}
READER = {"Authorization": f"Bearer {os.environ.get('LOAD_READER_TOKEN', '')}"}
ADAPTER_DIR = Path(os.environ.get("LOAD_ADAPTER_DIR", "."))
H_BASE = os.environ.get("LOAD_H_BASE", "")
FILES = ("adapter_config.json", "adapter_model.safetensors")


class RegistryUser(FastHttpUser):
    host = CP_URL
    wait_time = constant(0)
    weight = 3

    def on_start(self) -> None:
        fields: dict[str, object] = {"base": H_BASE}
        fields.update({name: (name, (ADAPTER_DIR / name).read_bytes(),
                              "application/octet-stream") for name in FILES})
        self.body, content_type = encode_multipart_formdata(fields)
        self.push_headers = {**ADMIN, "Content-Type": content_type}

    @task(10)
    def resolve(self) -> None:
        self.client.get(f"/v1/namespaces/{NAMESPACE}/aliases/{random.choice(ALIASES)}",
                        headers=READER, name="resolve")

    @task(3)
    def history(self) -> None:
        self.client.get(f"/v1/namespaces/{NAMESPACE}/aliases/{random.choice(ALIASES)}"
                        "/history?limit=8", headers=READER, name="history")

    @task(1)
    def push(self) -> None:
        self.client.post(f"/v1/namespaces/{NAMESPACE}/artifacts", data=self.body,
                         headers=self.push_headers, name="push")


class CompletionUser(FastHttpUser):
    host = AGENT_URL
    wait_time = constant(0)
    weight = 1

    @task
    def completion(self) -> None:
        self.client.post("/v1/completions", headers=READER, name="completion", json={
            "model": f"{NAMESPACE}/{random.choice(ALIASES)}",
            "prompt": [random.randrange(3, 250) for _ in range(8)], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True})
