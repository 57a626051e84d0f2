"""One error root per package boundary, one definition of each error.

* Every exception class defined under `dataplane/` derives from `dataplane.errors.EngineError`
  and has a non-empty str `code` (a class attribute, or per instance for the classes in
  `INSTANCE_CODED`), so callers catch `EngineError` alone.
* No two exception classes of dataplane/agent/controlplane/cli share a name, except the
  deliberate pairs in `DELIBERATE_TWINS`.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from collections import defaultdict
from pathlib import Path

import pytest

import dataplane
from dataplane.artifacts.errors import ArtifactRejected, RejectionCode
from dataplane.errors import EngineError
from dataplane.identity import IdentityError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dataplane", "agent", "controlplane", "cli")

INSTANCE_CODED: dict[type[EngineError], EngineError] = {
    ArtifactRejected: ArtifactRejected(RejectionCode.MISSING_FILE, "x"),
    IdentityError: IdentityError("invalid_field", "x"),
}
"""Classes whose `code` is set per instance (many stable codes, one class)."""

DELIBERATE_TWINS: dict[str, frozenset[str]] = {
    # Same HTTP meaning in two services that may not import each other (pyproject's
    # import-linter contracts: the agent reaches the control plane only through
    # controlplane.contracts; the control plane never imports the agent). The control
    # plane's render the admin API's ErrorBody (AdapterplaneError); the agent's answer
    # inference requests (ServingError -> the agent's OpenAI-style error body).
    "AliasRetired": frozenset({"controlplane.errors", "agent.catalog"}),
    "Forbidden": frozenset({"controlplane.errors", "agent.catalog"}),
    "Unauthenticated": frozenset({"controlplane.errors", "agent.catalog"}),
}

_NEEDS_DEVICE = ("cuda", "triton", "nvidia", "libcuda")


def _dataplane_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(dataplane.__path__, "dataplane.")]


def _import(name: str) -> object | None:
    """The module, or None when it cannot be imported on this machine for want of a GPU
    stack (CUDA / triton); any other import failure fails the test."""
    try:
        return importlib.import_module(name)
    except (ImportError, RuntimeError, OSError) as exc:
        if any(word in str(exc).lower() for word in _NEEDS_DEVICE):
            return None
        raise


def _runtime_dataplane_errors() -> tuple[dict[str, type[BaseException]], list[str]]:
    found: dict[str, type[BaseException]] = {}
    skipped: list[str] = []
    for name in _dataplane_modules():
        module = _import(name)
        if module is None:
            skipped.append(name)
            continue
        for attr, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == name):
                found[f"{name}.{attr}"] = obj
    return found, skipped


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _static_exception_classes() -> dict[str, list[str]]:
    """Class name -> modules defining an exception class of that name, from the source
    (nothing imported): a class is an exception when a base is a builtin exception or
    another exception class found here (fixed point over base names)."""
    classes: list[tuple[str, str, list[str]]] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                    classes.append((node.name, _module_name(path), bases))
    exception_names = {n for n in dir(builtins)
                       if inspect.isclass(getattr(builtins, n))
                       and issubclass(getattr(builtins, n), BaseException)}
    builtin = set(exception_names)
    while True:
        grown = {name for name, _, bases in classes if exception_names & set(bases)}
        if grown <= exception_names:
            break
        exception_names |= grown
    out: dict[str, list[str]] = defaultdict(list)
    for name, module, bases in classes:
        if name not in builtin and exception_names & set(bases):
            out[name].append(module)
    return out


def test_every_dataplane_exception_derives_from_engine_error_and_has_a_code() -> None:
    found, skipped = _runtime_dataplane_errors()
    assert len(found) > 30, sorted(found)  # the walk really reached the packages
    strays = sorted(q for q, cls in found.items() if not issubclass(cls, EngineError))
    assert strays == [], f"not under dataplane.errors.EngineError: {strays}"
    for qualname, cls in found.items():
        assert issubclass(cls, EngineError)
        if cls in INSTANCE_CODED:
            sample = INSTANCE_CODED[cls]
            assert isinstance(sample.code, str) and sample.code, qualname
            assert isinstance(sample.message, str) and isinstance(sample.detail, dict)
            continue
        code = cls.code
        assert isinstance(code, str) and code, qualname
        if cls is not EngineError:
            assert code != EngineError.code, f"{qualname} inherits the root's generic code"
    # every module that defines an exception class in its source was imported above
    static = {f"{m}.{n}" for n, mods in _static_exception_classes().items() for m in mods
              if m.startswith("dataplane")}
    missing = sorted(q for q in static - set(found)
                     if not any(q.startswith(f"{s}.") for s in skipped))
    assert missing == [], f"defined in the source but not found by the import walk: {missing}"


def test_codes_and_str_keep_their_established_forms() -> None:
    from dataplane.kernels.errors import LoraShapeError
    from dataplane.parallel.errors import IndivisibleShardError
    from dataplane.pool.errors import AdmissionRefused

    pool = AdmissionRefused("no pages", demand=3)
    assert (str(pool), pool.message, pool.detail) == (
        "INSUFFICIENT_ELIGIBLE_PAGES: no pages", "no pages", {"demand": 3})
    kernel = LoraShapeError("bad x")
    assert (str(kernel), kernel.code, kernel.detail) == (
        "lora_shape_mismatch: bad x", "lora_shape_mismatch", {})
    assert str(IndivisibleShardError("7 heads")) == "indivisible_shard: 7 heads"
    rejected = ArtifactRejected(RejectionCode.RANK_LIMIT, "rank 99", {"rank": 99})
    assert rejected.code is RejectionCode.RANK_LIMIT
    assert (str(rejected), rejected.detail) == ("rank_limit: rank 99", {"rank": 99})
    assert str(IdentityError("invalid_field", "bad")) == "invalid_field: bad"
    plain = EngineError("boom", where="here")
    assert (str(plain), plain.code, plain.detail) == ("boom", "ENGINE_ERROR", {"where": "here"})


def test_no_exception_class_is_defined_twice() -> None:
    twins = {name: frozenset(mods) for name, mods in _static_exception_classes().items()
             if len(mods) > 1}
    unexpected = {n: sorted(m) for n, m in twins.items() if DELIBERATE_TWINS.get(n) != m}
    assert unexpected == {}, f"exception classes defined more than once: {unexpected}"
    stale = sorted(set(DELIBERATE_TWINS) - set(twins))
    assert stale == [], f"DELIBERATE_TWINS lists pairs that no longer exist: {stale}"


@pytest.mark.parametrize("name", ["dataplane.errors", "dataplane.artifacts"])
def test_error_roots_stay_torch_free(name: str) -> None:
    import subprocess
    import sys

    code = (f"import sys, {name}; "
            "sys.exit(1 if any(m == 'torch' or m.startswith('torch.') for m in sys.modules) "
            "else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
