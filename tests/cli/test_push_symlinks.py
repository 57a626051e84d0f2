"""`adapterctl push DIR` refuses adapter files that are symlinks before sending anything
(a link may point anywhere on the pushing machine)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli.artifacts import push_directory
from cli.client import ApiClient
from cli.errors import CliError, ExitCode


@pytest.mark.parametrize("name", ["adapter_config.json", "adapter_model.safetensors"])
def test_symlinked_adapter_file_is_refused(tmp_path: Path, name: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / name).write_bytes(b'{"peft_type": "LORA"}')
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for file in ("adapter_config.json", "adapter_model.safetensors"):
        (adapter / file).write_bytes(b"{}")
    (adapter / name).unlink()
    (adapter / name).symlink_to(outside / name)
    # nothing listens here: a refusal that sent a request would fail differently
    with ApiClient("http://127.0.0.1:9", "ap_unused") as client, \
            pytest.raises(CliError) as refused:
        push_directory(client, "acme", "0" * 64, adapter)
    assert refused.value.exit_code == ExitCode.USAGE
    assert "symlink" in str(refused.value) and name in str(refused.value)
    shutil.rmtree(outside)
