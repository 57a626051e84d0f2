"""A real control plane for the adapterctl end-to-end tests.

One session-wide stack, started through the same `EmbeddedStack` that `adapterplane up`
uses: `adapterplane migrate` + `bootstrap-token`, then the API (uvicorn, free port) and
one Celery worker as real subprocesses. The database is the Postgres test DB, in a
private schema of this session; objects live under a temporary file:// store and the
worker's broker is a private SQLite file in the same directory, so no other test
session's worker can take our jobs. Tests isolate themselves further by creating
their own uniquely named namespace.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner, Result

from cli.main import app
from cli.stack import EmbeddedStack
from dataplane.assets import make_peft_adapter, make_tiny_llama

BASE_SEED = 4242
S3_KEY = "testing"


@dataclass(frozen=True)
class CliAssets:
    base: Path
    adapter_a: Path
    adapter_b: Path
    adapter_nan: Path
    """adapter_a with one lora_B value replaced by NaN: must be rejected."""


@pytest.fixture(scope="session")
def cli_assets(tmp_path_factory: pytest.TempPathFactory) -> CliAssets:
    root = tmp_path_factory.mktemp("cli-assets")
    base = make_tiny_llama(root / "base", seed=BASE_SEED)
    adapter_a = make_peft_adapter(
        base, root / "a", seed=1, rank=4, alpha=8, target_modules=["q_proj", "v_proj"]
    )
    adapter_b = make_peft_adapter(
        base, root / "b", seed=2, rank=2, alpha=4, target_modules=["q_proj", "k_proj", "o_proj"]
    )
    adapter_nan = root / "nan"
    adapter_nan.mkdir()
    (adapter_nan / "adapter_config.json").write_bytes(
        (adapter_a / "adapter_config.json").read_bytes()
    )
    tensors = load_file(adapter_a / "adapter_model.safetensors")
    name = sorted(k for k in tensors if "lora_B" in k)[0]
    tensors[name] = tensors[name].clone()
    tensors[name][0, 0] = torch.nan
    save_file(tensors, adapter_nan / "adapter_model.safetensors")
    return CliAssets(base, adapter_a, adapter_b, adapter_nan)


@pytest.fixture(scope="session")
def cli_database_url(schema_database: Callable[[str], AbstractContextManager[str]]
                        ) -> Iterator[str]:
    """The Postgres test database, confined to a private schema (dropped at the end).

    Other test packages TRUNCATE the test database's tables between their tests; our
    server lives for the whole session, so it gets its own `search_path` schema.
    """
    with schema_database("cli") as url:
        yield url


@pytest.fixture(scope="session")
def control_plane(
    tmp_path_factory: pytest.TempPathFactory, cli_database_url: str, s3_endpoint: str
) -> Iterator[EmbeddedStack]:
    """API + worker; storage is file://, and s3:// imports read from the moto server."""
    stack = EmbeddedStack(
        tmp_path_factory.mktemp("control-plane"),
        port=0,
        embedded_only=True,
        extra_env={
            "ADAPTERPLANE_DATABASE_URL": cli_database_url,
            "ADAPTERPLANE_ENVIRONMENT": "test",
            "ADAPTERPLANE_S3_ENDPOINT_URL": s3_endpoint,
            "ADAPTERPLANE_S3_ACCESS_KEY_ID": S3_KEY,
            "ADAPTERPLANE_S3_SECRET_ACCESS_KEY": S3_KEY,
            # `push file:///...` of the session's assets (file:// imports are off by default)
            "ADAPTERPLANE_ALLOW_FILE_URI_IMPORT": "true",
            "ADAPTERPLANE_FILE_IMPORT_ROOTS": json.dumps([str(tmp_path_factory.getbasetemp())]),
        },
    )
    with stack:
        yield stack


Invoke = Callable[..., Result]


@pytest.fixture(scope="session")
def adapterctl(control_plane: EmbeddedStack) -> Invoke:
    """Run adapterctl in-process (real Typer app, real HTTP); admin token by default."""
    runner = CliRunner()
    admin = control_plane.token()

    def invoke(*args: str, token: str | None = None) -> Result:
        env = {
            "ADAPTERPLANE_URL": control_plane.url,
            "ADAPTERPLANE_TOKEN": admin if token is None else token,
            "COLUMNS": "200",  # tables as a wide pipe prints them, whatever the runner's
        }
        return runner.invoke(app, list(args), env=env, catch_exceptions=False)

    return invoke


@pytest.fixture(scope="session")
def h_base(adapterctl: Invoke, cli_assets: CliAssets) -> str:
    import json

    result = adapterctl(
        "-o", "json", "bases", "register", str(cli_assets.base), "--name", "cli-tests-tiny"
    )
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["h_base"])


@pytest.fixture
def namespace(adapterctl: Invoke) -> str:
    name = f"cli-{uuid.uuid4().hex[:10]}"
    result = adapterctl("namespaces", "create", name)
    assert result.exit_code == 0, result.output
    return name


@pytest.fixture
def push_wait(adapterctl: Invoke, h_base: str, namespace: str) -> Callable[[str], Result]:
    """`adapterctl -o json push SOURCE -n <namespace> -b <h_base> --wait --timeout 60`.

    Returns the raw `Result` (exit code unchecked) so refusal tests can use it too.
    """

    def push(source: str) -> Result:
        return adapterctl(
            "-o", "json", "push", source, "-n", namespace, "-b", h_base, "--wait", "--timeout", "60"
        )

    return push
