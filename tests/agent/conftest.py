"""Agent test fixtures: assets, one control plane and one agent per session.

The control plane is `cli.stack.EmbeddedStack` (`adapterplane migrate`,
`bootstrap-token`, `api`, `worker` as real processes) on a private Postgres schema, with
object storage on the moto S3 server, so agents download through presigned URLs.

Assets: a tiny random Llama with a byte-level tokenizer (256 ids = 256 bytes, so any
text encodes) and a chat template, plus real PEFT adapters of different ranks and
targets. References come from HF transformers + PEFT (tests/engine/helpers.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dataplane.artifacts import read_base_abi
from dataplane.assets import make_peft_adapter, make_tiny_llama

from .assets import GreedyReference, write_byte_tokenizer
from .stack import Admin, AgentProcess

if TYPE_CHECKING:  # the control-plane imports stay lazy: GPU hosts run the engine-side
    from cli.stack import EmbeddedStack  # tests here without boto3/SQLAlchemy installed

AGENT_MAX_RANK = 8
S3_KEY = "testing"
ADAPTERS: dict[str, dict[str, Any]] = {
    "a": dict(seed=1, rank=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    "b": dict(seed=2, rank=8, alpha=16,
              target_modules=["q_proj", "k_proj", "o_proj", "down_proj"]),
    "c": dict(seed=3, rank=2, alpha=4, target_modules=["gate_proj", "up_proj", "v_proj"]),
    "d": dict(seed=4, rank=4, alpha=16, target_modules=["q_proj", "v_proj", "o_proj"]),
    "wide": dict(seed=5, rank=AGENT_MAX_RANK * 2, alpha=8, target_modules=["q_proj"]),
    "corrupt": dict(seed=6, rank=2, alpha=2, target_modules=["k_proj"]),
}
"""a/b/c: published at start; d: republish target; wide: rank above the agent's max;
corrupt: its stored bytes are overwritten after validation."""


@dataclass(frozen=True)
class AgentAssets:
    base: Path
    adapters: dict[str, Path]


@pytest.fixture(scope="session")
def agent_assets(tmp_path_factory: pytest.TempPathFactory) -> AgentAssets:
    root = tmp_path_factory.mktemp("agent-assets")
    base = make_tiny_llama(root / "tiny-base", seed=7)
    write_byte_tokenizer(base)
    adapters = {n: make_peft_adapter(base, root / n, **spec) for n, spec in ADAPTERS.items()}
    return AgentAssets(base, adapters)


@pytest.fixture(scope="session")
def reference(agent_assets: AgentAssets) -> GreedyReference:
    """HF transformers + PEFT, every adapter loaded (greedy, one request at a time)."""
    usable = {k: v for k, v in agent_assets.adapters.items() if k != "wide"}
    return GreedyReference(agent_assets.base, usable)


@dataclass
class Deployment:
    """Control plane + published aliases + one agent, shared by the module's tests."""

    cp: EmbeddedStack
    s3: Any
    bucket: str
    admin: Admin
    namespace: str
    h_base: str
    artifacts: dict[str, dict[str, Any]]
    agent_token: str
    reader_token: str
    outsider_token: str
    agent: AgentProcess
    agent_env: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="session")
def s3_bucket(s3_endpoint: str) -> tuple[Any, str]:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY)
    bucket = f"agent-tests-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


@pytest.fixture(scope="session")
def agent_database_url(schema_database: Callable[[str], AbstractContextManager[str]]
                          ) -> Iterator[str]:
    """The Postgres test database, confined to a private schema (dropped at the end), so
    other packages' TRUNCATEs cannot touch this session-long control plane. Catalog
    NOTIFYs are database-wide, so agents' long-polls wake through LISTEN."""
    with schema_database("agent") as url:
        yield url


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str,
                  s3_bucket: tuple[Any, str],
                  agent_database_url: str) -> Iterator[EmbeddedStack]:
    from cli.stack import EmbeddedStack

    bucket = s3_bucket[1]
    stack = EmbeddedStack(
        tmp_path_factory.mktemp("agent-cp"), port=0, embedded_only=True,
        extra_env={"ADAPTERPLANE_ENVIRONMENT": "test",
                   "ADAPTERPLANE_DATABASE_URL": agent_database_url,
                   "ADAPTERPLANE_STORAGE_URL": f"s3://{bucket}/objects",
                   "ADAPTERPLANE_S3_ENDPOINT_URL": s3_endpoint,
                   "ADAPTERPLANE_S3_ACCESS_KEY_ID": S3_KEY,
                   "ADAPTERPLANE_S3_SECRET_ACCESS_KEY": S3_KEY})
    with stack:
        yield stack


@pytest.fixture(scope="session")
def deployment(control_plane: EmbeddedStack, agent_assets: AgentAssets,
               s3_bucket: tuple[Any, str],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    admin = Admin(control_plane.url, control_plane.token())
    abi = read_base_abi(agent_assets.base).to_record()
    h_base = str(admin.call("POST", "/v1/bases",
                            json={"name": "agent-tiny", "abi": abi})["h_base"])
    namespace = f"ag-{uuid.uuid4().hex[:8]}"
    admin.call("POST", "/v1/namespaces", json={"name": namespace})
    artifacts = {n: admin.push(namespace, h_base, p) for n, p in agent_assets.adapters.items()}
    for name in ("a", "b", "c"):
        admin.publish(namespace, name, artifacts[name]["id"])
    agent_token = admin.token("agent-0", [], is_agent=True)
    reader = admin.token("reader", [{"namespace": namespace, "role": "read"}])
    outsider = admin.token("outsider", [{"namespace": "elsewhere", "role": "read"}])
    work = tmp_path_factory.mktemp("agent-0")
    env = {"ADAPTERPLANE_AGENT_CONTROL_PLANE_URL": control_plane.url,
           "ADAPTERPLANE_AGENT_TOKEN": agent_token,
           "ADAPTERPLANE_AGENT_NAME": "agent-0",
           "ADAPTERPLANE_AGENT_MODEL_DIR": str(agent_assets.base),
           "ADAPTERPLANE_AGENT_CACHE_DIR": str(work / "cache"),
           "ADAPTERPLANE_AGENT_MAX_RANK": str(AGENT_MAX_RANK),
           "ADAPTERPLANE_AGENT_MAX_SLOTS": "3",
           "ADAPTERPLANE_AGENT_NUM_KV_BLOCKS": "256",
           "ADAPTERPLANE_AGENT_LONG_POLL_S": "5",
           "ADAPTERPLANE_AGENT_HEARTBEAT_INTERVAL_S": "0.5"}
    agent = AgentProcess(work / "agent.log", env)
    agent.start()
    try:
        yield Deployment(control_plane, s3_bucket[0], s3_bucket[1], admin, namespace, h_base,
                         artifacts, agent_token, reader, outsider, agent, env)
    finally:
        agent.stop()


@contextmanager
def extra_agent(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory, name: str,
                env: dict[str, str]) -> Iterator[AgentProcess]:
    """A second agent process of `deployment` named `name`, with its own cache directory
    and `env` on top of the deployment's agent settings; stopped on exit."""
    work = tmp_path_factory.mktemp(name)
    agent = AgentProcess(work / "agent.log", {
        **deployment.agent_env, "ADAPTERPLANE_AGENT_NAME": name,
        "ADAPTERPLANE_AGENT_CACHE_DIR": str(work / "cache"), **env})
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
