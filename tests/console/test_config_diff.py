"""The adapter-config diff: flattened keys, whole lists, JSON types."""

from __future__ import annotations

from controlplane.console.views.config_diff import ConfigChange, diff_configs


def test_diff_lists_each_changed_key_once() -> None:
    before = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
              "fan_in_fan_out": False, "extra": {"a": 1, "b": 2}, "gone": None}
    after = {"r": 4, "lora_alpha": 8.0, "target_modules": ["v_proj", "q_proj"],
             "fan_in_fan_out": 0, "extra": {"a": 1, "c": 3}, "new": "x"}
    diff = diff_configs(before, after)
    assert diff.changes == [
        ConfigChange("extra.b", "removed", "2", None),
        ConfigChange("extra.c", "added", None, "3"),
        ConfigChange("fan_in_fan_out", "changed", "false", "0"),
        ConfigChange("gone", "removed", "null", None),
        ConfigChange("lora_alpha", "changed", "8", "8.0"),
        ConfigChange("new", "added", None, '"x"'),
        ConfigChange("target_modules", "changed", '["q_proj", "v_proj"]',
                     '["v_proj", "q_proj"]'),
    ]
    assert diff.unchanged == 2  # r, extra.a


def test_identical_configs_have_no_change() -> None:
    doc = {"r": 2, "nested": {"deep": {"x": [1, 2]}}}
    diff = diff_configs(doc, {"nested": {"deep": {"x": [1, 2]}}, "r": 2})
    assert diff.changes == [] and diff.unchanged == 2
