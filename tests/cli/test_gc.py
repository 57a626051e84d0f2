"""`adapterctl artifacts delete` and `adapterctl gc` end to end on the session's real
stack (API + worker processes, file:// store under the stack's data dir)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, text
from typer.testing import CliRunner, Result

from cli.main import app
from cli.stack import EmbeddedStack
from controlplane.db import make_engine
from dataplane.assets import make_peft_adapter


def test_delete_then_gc(adapterctl: Callable[..., Result], push_wait: Callable[[str], Result],
                        namespace: str, cli_assets: Any, control_plane: EmbeddedStack,
                        cli_database_url: str, tmp_path: Path) -> None:
    # an adapter no other test pushes, so its blobs are this test's alone
    own = make_peft_adapter(cli_assets.base, tmp_path / "own", seed=9001, rank=2, alpha=4,
                            target_modules=["q_proj"])
    pushed = push_wait(str(own))
    assert pushed.exit_code == 0, pushed.output
    artifact = json.loads(pushed.stdout)
    published = push_wait(str(cli_assets.adapter_b))
    kept = json.loads(published.stdout)
    assert adapterctl("publish", f"{namespace}/bot", str(kept["id"])).exit_code == 0

    refused = adapterctl("artifacts", "delete", namespace, str(kept["id"]), "--yes")
    assert refused.exit_code == 4 and "error: ARTIFACT_REFERENCED:" in refused.stderr
    declined = CliRunner().invoke(
        app, ["artifacts", "delete", namespace, str(artifact["id"])], input="n\n",
        env={"ADAPTERPLANE_URL": control_plane.url, "ADAPTERPLANE_TOKEN": control_plane.token()})
    assert declined.exit_code == 2, declined.output
    assert adapterctl("artifacts", "show", namespace, str(artifact["id"])).exit_code == 0

    deleted = adapterctl("-o", "json", "artifacts", "delete", namespace, str(artifact["id"]),
                         "--yes")
    assert deleted.exit_code == 0, deleted.output
    assert json.loads(deleted.stdout)["id"] == artifact["id"]
    assert adapterctl("artifacts", "show", namespace, str(artifact["id"])).exit_code == 3

    objects = control_plane.data_dir / "objects"
    keys = {f"blobs/sha256/{hashlib.sha256((own / n).read_bytes()).hexdigest()}"
            for n in ("adapter_config.json", "adapter_model.safetensors")}
    keys.add(artifact["storage_key"])
    young = json.loads(adapterctl("-o", "json", "gc", "--dry-run").stdout)
    assert not keys & {r["key"] for r in young["removed"]}  # within the 24 h grace
    stamp = time.time() - 3 * 24 * 3600
    for key in keys:
        os.utime(objects / key, (stamp, stamp))
    # the push's leases are as fresh as the push: blobs and leases must both be old
    still_leased = json.loads(adapterctl("-o", "json", "gc", "--dry-run").stdout)
    assert not keys & {r["key"] for r in still_leased["removed"]}
    assert still_leased["kept_leased"] >= len(keys)
    assert all((objects / key).exists() for key in keys)
    table = adapterctl("gc", "--dry-run")
    assert table.exit_code == 0 and "would remove" in table.stderr

    engine = make_engine(cli_database_url, pool_size=1)
    try:  # the push is long over: age its leases as the clock would
        with engine.begin() as conn:
            conn.execute(text("UPDATE blob_leases SET leased_at = :t WHERE key IN :keys")
                         .bindparams(bindparam("keys", expanding=True)),
                         {"t": datetime.now(UTC) - timedelta(days=3), "keys": sorted(keys)})
    finally:
        engine.dispose()
    removed = adapterctl("-o", "json", "gc")
    assert removed.exit_code == 0, removed.output
    report = json.loads(removed.stdout)
    assert keys <= {r["key"] for r in report["removed"]} and report["dry_run"] is False
    assert not any((objects / key).exists() for key in keys)
    for ref in kept["files"].values():  # the published artifact's blobs stay
        assert (objects / ref["key"]).exists()

    reader = json.loads(adapterctl("-o", "json", "tokens", "create", "--name", "r", "--grant",
                                   f"{namespace}:admin").stdout)["token"]
    assert adapterctl("gc", token=reader).exit_code == 6
