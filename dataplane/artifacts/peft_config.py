"""`adapter_config.json` for LoRA: strict parsing, PEFT's matching rules, canonical digest.

Matching follows peft 0.21 (`check_target_module_exists`, `get_pattern_key`) applied to
canonical base-module names such as "model.layers.3.self_attn.q_proj":
- target_modules as a string is a regex that must fullmatch the name; as a list, an entry
  matches the whole name or a ".entry" suffix; "all-linear" means every base projection.
- layers_to_transform (int or list) keeps only those layer indices (list targets only).
- rank_pattern / alpha_pattern: the first key (in file order) with
  re.match(rf"(.*\\.)?({key})$", name) wins; otherwise r / lora_alpha.
- exclude_modules (string regex or list, same rules) removes names.

The PEFT-config digest covers only fields that change the adapter's function
(SEMANTIC_FIELDS); provenance (base_model_name_or_path, revision, peft_version) and
training-only fields (lora_dropout, init_lora_weights, inference_mode) are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dataplane.artifacts.errors import ArtifactRejected, RejectionCode
from dataplane.artifacts.json_files import exact_digest
from dataplane.identity import SCALING_ALPHA_OVER_R, SCALING_RSLORA

ALL_LINEAR = "all-linear"
EMBEDDING_TARGETS = ("embed_tokens", "lm_head", "wte", "word_embeddings", "embed_in",
                     "embed_out")
IGNORED_FIELDS = frozenset({
    "base_model_name_or_path", "revision", "peft_version", "inference_mode", "task_type",
    "init_lora_weights", "lora_dropout", "auto_mapping", "megatron_core", "qalora_group_size",
    "loftq_config", "corda_config", "eva_config", "lora_ga_config", "monteclora_config",
    "kasa_config", "arrow_config", "ensure_weight_tying",
})
"""Provenance or training-time fields: any value accepted, not hashed."""
SEMANTIC_FIELDS = ("peft_type", "r", "lora_alpha", "target_modules", "rank_pattern",
                   "alpha_pattern", "use_rslora", "layers_to_transform", "layers_pattern",
                   "exclude_modules")
OFF_FIELDS = ("use_dora", "modules_to_save", "lora_bias", "fan_in_fan_out",
              "layer_replication", "trainable_token_indices", "target_parameters",
              "megatron_config", "use_qalora", "use_bdlora", "velora_config")
"""Features we do not serve: each must be absent, null, false, empty or "none"."""
ALORA_FIELD = "alora_invocation_tokens"
"""Activated LoRA: the token ids whose last occurrence in a request switches the adapter on
(rows before it run as the base model). Hashed when present; absent for plain LoRA, so a
plain LoRA's digest does not depend on the field existing."""
_LAYER_INDEX = re.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")


def _malformed(message: str, **detail: object) -> ArtifactRejected:
    return ArtifactRejected(RejectionCode.MALFORMED_CONFIG, message, dict(detail))


def _unsupported(message: str, **detail: object) -> ArtifactRejected:
    return ArtifactRejected(RejectionCode.UNSUPPORTED_FEATURE, message, dict(detail))


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _malformed(f"{name} must be a positive integer", field=name)
    return value


def _positive_number(value: object, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)) or value <= 0:
        raise _malformed(f"{name} must be a positive number", field=name)
    return Fraction(value)


def _str_list(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _malformed(f"{name} must be a list of non-empty strings", field=name)
    return tuple(value)


@dataclass(frozen=True)
class LoraSettings:
    """The parsed, checked LoRA config. Pattern dicts keep file order (first match wins)."""

    r: int
    lora_alpha: Fraction
    use_rslora: bool
    target_modules: str | tuple[str, ...]
    rank_pattern: tuple[tuple[str, int], ...]
    alpha_pattern: tuple[tuple[str, Fraction], ...]
    layers_to_transform: tuple[int, ...] | None
    exclude_modules: str | tuple[str, ...] | None
    peft_config_sha256: str
    invocation_tokens: tuple[int, ...] | None = None
    """aLoRA invocation token ids (None: a plain LoRA, always on)."""

    @property
    def scaling_rule(self) -> str:
        return SCALING_RSLORA if self.use_rslora else SCALING_ALPHA_OVER_R

    def rank_for(self, name: str) -> int:
        return _first_match(self.rank_pattern, name, self.r)

    def alpha_for(self, name: str) -> Fraction:
        return _first_match(self.alpha_pattern, name, self.lora_alpha)

    def targets(self, name: str) -> bool:
        """Would PEFT wrap base module `name` with this config?"""
        if self.exclude_modules is not None and _matches(self.exclude_modules, name):
            return False
        if not _matches(self.target_modules, name):
            return False
        if self.layers_to_transform is not None and not isinstance(self.target_modules, str):
            match = _LAYER_INDEX.match(name)
            return match is not None and int(match["idx"]) in self.layers_to_transform
        return True

    def expected_modules(self, base_modules: Iterable[str]) -> list[str]:
        return sorted(name for name in base_modules if self.targets(name))


def _matches(spec: str | tuple[str, ...], name: str) -> bool:
    if isinstance(spec, str):
        return spec == ALL_LINEAR or re.fullmatch(spec, name) is not None
    return name in spec or any(name.endswith(f".{key}") for key in spec)


def _first_match(pattern: tuple[tuple[str, Any], ...], name: str, default: Any) -> Any:
    for key, value in pattern:
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def _is_off(value: object) -> bool:
    return value in (None, False, "none", "") or value == [] or value == {}


def _module_spec(value: object, name: str) -> str | tuple[str, ...]:
    if isinstance(value, str):
        if not value:
            raise _malformed(f"{name} must not be empty", field=name)
        try:
            re.compile(value)
        except re.error as exc:
            raise _malformed(f"{name} is not a valid regex ({exc})", field=name) from exc
        return value
    modules = _str_list(value, name)
    if not modules:
        raise _malformed(f"{name} must not be empty", field=name)
    return modules


def _pattern(value: object, name: str, parse: Any) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _malformed(f"{name} must be an object", field=name)
    out = []
    for key, item in value.items():
        try:
            re.compile(key)
        except re.error as exc:
            raise _malformed(f"{name} key {key!r} is not a regex", field=name) from exc
        out.append((key, parse(item, f"{name}[{key}]")))
    return tuple(out)


def parse_lora_config(config: Mapping[str, Any]) -> LoraSettings:
    """Check a parsed adapter_config.json and return its LoRA settings.

    Raises UNSUPPORTED_FEATURE (non-LoRA method, DoRA, biases, modules_to_save,
    embedding targets, unknown non-default fields) or MALFORMED_CONFIG.
    """
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise _unsupported(f"peft_type {peft_type!r} is not LORA", field="peft_type")
    for key in OFF_FIELDS:
        if not _is_off(config.get(key)):
            raise _unsupported(f"{key}={config[key]!r} is not supported", field=key)
    if config.get("bias", "none") != "none":
        raise _unsupported(f"bias={config['bias']!r}: trained biases are not supported",
                           field="bias")
    known = set(SEMANTIC_FIELDS) | set(OFF_FIELDS) | IGNORED_FIELDS | {"bias", ALORA_FIELD}
    for key, value in config.items():
        if key not in known and not _is_off(value):
            raise _unsupported(f"unknown config field {key!r}={value!r}", field=key)
    if "target_modules" not in config:
        raise _malformed("target_modules is missing", field="target_modules")
    targets = _module_spec(config["target_modules"], "target_modules")
    roles = [targets] if isinstance(targets, str) else list(targets)
    for role in roles:
        if role in EMBEDDING_TARGETS or any(role.endswith(f".{e}") for e in EMBEDDING_TARGETS):
            raise _unsupported(f"target {role!r} is an embedding/lm_head",
                               field="target_modules")
    if not isinstance(config.get("use_rslora", False), bool):
        raise _malformed("use_rslora must be a boolean", field="use_rslora")
    layers = config.get("layers_to_transform")
    if layers is not None:
        layers = [layers] if isinstance(layers, int) and not isinstance(layers, bool) else layers
        if not isinstance(layers, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers
        ):
            raise _malformed("layers_to_transform must be an int or a list of ints",
                             field="layers_to_transform")
        layers = tuple(layers)
    exclude = config.get("exclude_modules")
    settings = LoraSettings(
        r=_positive_int(config.get("r"), "r"),
        lora_alpha=_positive_number(config.get("lora_alpha"), "lora_alpha"),
        use_rslora=bool(config.get("use_rslora", False)),
        target_modules=targets,
        rank_pattern=_pattern(config.get("rank_pattern"), "rank_pattern", _positive_int),
        alpha_pattern=_pattern(config.get("alpha_pattern"), "alpha_pattern",
                               _positive_number),
        layers_to_transform=layers,
        exclude_modules=None if _is_off(exclude) else _module_spec(exclude, "exclude_modules"),
        peft_config_sha256=exact_digest(_semantic_record(config)),
        invocation_tokens=_invocation_tokens(config.get(ALORA_FIELD)),
    )
    return settings


def _invocation_tokens(value: object) -> tuple[int, ...] | None:
    """aLoRA invocation tokens: absent/null, or a non-empty list of token ids (ints >= 0;
    the base's vocabulary bound is checked against the base at validation)."""
    if value is None:
        return None
    if (not isinstance(value, list) or not value
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                       for t in value)):
        raise _malformed(f"{ALORA_FIELD} must be a non-empty list of token ids",
                         field=ALORA_FIELD)
    return tuple(value)


def _semantic_record(config: Mapping[str, Any]) -> dict[str, Any]:
    record = {key: config.get(key) for key in SEMANTIC_FIELDS}
    # pattern order decides the first match, so keep it: objects become [key, value] lists
    for key in ("rank_pattern", "alpha_pattern"):
        record[key] = [[k, v] for k, v in (config.get(key) or {}).items()]
    if isinstance(record["target_modules"], list):
        record["target_modules"] = sorted(set(record["target_modules"]))
    record["use_rslora"] = bool(config.get("use_rslora", False))
    if config.get(ALORA_FIELD) is not None:
        record[ALORA_FIELD] = list(config[ALORA_FIELD])
    return record
