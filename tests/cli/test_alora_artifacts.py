"""`adapterctl push` / `artifacts show` with an activated LoRA (PEFT aLoRA) against the real
control plane: it validates, and its invocation tokens are shown with the artifact."""

from __future__ import annotations

from pathlib import Path

from test_lifecycle import CliAssets, Invoke, PushWait, ok_json

from dataplane.assets import make_peft_adapter


def test_an_alora_pushes_and_shows_its_activation(
        adapterctl: Invoke, cli_assets: CliAssets, namespace: str,
        push_wait: PushWait, tmp_path: Path) -> None:
    alora = make_peft_adapter(cli_assets.base, tmp_path / "alora", seed=5, rank=2, alpha=4,
                              target_modules=["q_proj", "v_proj"],
                              alora_invocation_tokens=[11, 12])
    art = ok_json(push_wait(str(alora)))
    assert art["state"] == "validated"
    assert art["validated_record"]["alora_invocation_tokens"] == [11, 12]
    shown = adapterctl("artifacts", "show", namespace, str(art["id"]))
    assert shown.exit_code == 0, shown.output
    assert "aLoRA, invoked by tokens [11, 12]" in shown.stdout
    plain = ok_json(push_wait(str(cli_assets.adapter_a)))
    shown = adapterctl("artifacts", "show", namespace, str(plain["id"]))
    assert "always on" in shown.stdout
