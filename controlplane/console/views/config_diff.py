"""Key-by-key difference of two adapter configs (`adapter_config.json` documents).

Nested objects are flattened to dotted keys (`lora_config.r`); a list is one value
(`target_modules` changes as a whole, shown as JSON). Values are compared as parsed
JSON, so formatting and key order never count as a change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

ChangeKind = Literal["added", "removed", "changed"]


@dataclass(frozen=True)
class ConfigChange:
    key: str
    kind: ChangeKind
    before: str | None
    """The old value as JSON (None: the key was absent)."""
    after: str | None


@dataclass(frozen=True)
class ConfigDiff:
    changes: list[ConfigChange]
    unchanged: int
    """Keys present in both with equal values."""


def flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def diff_configs(before: dict[str, Any], after: dict[str, Any]) -> ConfigDiff:
    old, new = flatten(before), flatten(after)
    changes: list[ConfigChange] = []
    unchanged = 0
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            changes.append(ConfigChange(key, "removed", _text(old[key]), None))
        elif key not in old:
            changes.append(ConfigChange(key, "added", None, _text(new[key])))
        elif old[key] != new[key] or type(old[key]) is not type(new[key]):
            changes.append(ConfigChange(key, "changed", _text(old[key]), _text(new[key])))
        else:
            unchanged += 1
    return ConfigDiff(changes, unchanged)
