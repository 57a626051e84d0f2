"""Generate docs/CONFIG.md from the settings classes; `--check` fails when it has drifted.

    .venv/bin/python -m cli.config_docs           # rewrite docs/CONFIG.md
    .venv/bin/python -m cli.config_docs --check   # exit 1 if it differs (CI, scripts/test.sh)

One table per settings class (`SECTIONS`), built from the class itself: environment
variable, type (with the field's bounds), default, description (the field's
`description=` or attribute docstring). Defaults are rendered from the default's source
expression where that is not a constant (`Path.cwd() / 'var'`, `os.cpu_count()` render as
written), so the file is the same on every machine; `SecretStr` defaults render as
`(secret)`. Nothing is read from the environment.

`ADAPTERPLANE_*` variables that are read with `os.environ` rather than through a settings
class are listed by hand in `OTHER_VARIABLES` and `TEST_VARIABLES`. `--check` also scans the
services' sources (`SCANNED_PACKAGES`) for `ADAPTERPLANE_*` names that are neither a
settings field nor listed there, and verifies that each listed variable is still mentioned
in the files it is said to be read in.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Literal

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from agent.config import AgentSettings
from agent.router.config import RouterSettings
from controlplane.config import Settings

ROOT = Path(__file__).resolve().parents[1]
DOC_PATH = Path("docs/CONFIG.md")
REGENERATE = ".venv/bin/python -m cli.config_docs"
SCANNED_PACKAGES = ("controlplane", "agent", "dataplane", "cli")


@dataclass(frozen=True)
class Section:
    title: str
    settings: type[BaseSettings]
    intro: str


SECTIONS = (
    Section(
        "Control plane", Settings,
        "Read by every control-plane process: `adapterplane api`, `worker`, `migrate`, "
        "`bootstrap-token`, and the children `adapterplane up` starts (which sets "
        "`ADAPTERPLANE_DATA_DIR` for them; `up` itself reads it directly, `--data-dir` "
        "overrides it)."),
    Section(
        "Agent", AgentSettings,
        "Read by `adapterplane agent` / `python -m agent.daemon`. Every setting can also be "
        "given as an argument, `--<field>=<value>` with `-` or `_` (`--max-slots=16`), "
        "which wins over the environment; `adapterplane agent --help` lists them."),
    Section(
        "Router", RouterSettings,
        "Read by `adapterplane router` (the fleet's OpenAI-compatible front door). "
        "Settings can also be given as `--<field>=<value>` arguments; `adapterplane router "
        "--help` lists them."),
)


@dataclass(frozen=True)
class EnvVar:
    """An `ADAPTERPLANE_*` variable read with `os.environ`, outside the settings classes."""

    name: str
    read_in: tuple[str, ...]
    """Repository-relative files that read it (each must mention `name`)."""
    default: str
    """Markdown: the behaviour when it is unset."""
    meaning: str
    """Markdown: what it does."""


OTHER_VARIABLES = (
    EnvVar("ADAPTERPLANE_URL", ("cli/client.py",), "`http://127.0.0.1:8400`",
           "`adapterctl`: base URL of the admin API when `--url` is not given "
           "(`cli.client.URL_ENV`)."),
    EnvVar("ADAPTERPLANE_TOKEN", ("cli/client.py",), "unset",
           "`adapterctl`: bearer token when `--token` is not given "
           "(`cli.client.TOKEN_ENV`)."),
    EnvVar("ADAPTERPLANE_FAULTS", ("dataplane/pool/faults.py",), "unset (off)",
           "Fault injection armed when an agent starts (`FaultInjector.from_env`, "
           "`dataplane.pool.faults.ENV_VAR`): comma-separated "
           "`POINT=ACTION[:SECONDS][@PAGES][*TIMES]`, points `copy`, `validate`, "
           "`publish`, `download`, actions `fail`, `delay`; e.g. "
           "`copy=fail@2,download=fail*3`. A bad spec stops the agent at start-up."),
    EnvVar("ADAPTERPLANE_LORA_BACKEND", ("dataplane/kernels/__init__.py",),
           "unset: Triton on CUDA, torch on CPU",
           "LoRA kernel backend where the engine names none (`get_lora_backend`): "
           "`triton` or `torch`; Triton on a CPU device needs `TRITON_INTERPRET=1`."),
    EnvVar("ADAPTERPLANE_LORA_TUNED", ("dataplane/kernels/triton/configs.py",),
           "unset: only the shipped tables (tuned on the H200)",
           "More LoRA kernel tile tables (JSON written by `bench/lora_kernels.py --tune`, "
           "`bench/lora_silu.py --sweep`), separated by `os.pathsep`, loaded at import "
           "after the shipped ones, in order (a later file's entries replace earlier "
           "ones); a bad file raises and applies nothing."),
    EnvVar("ADAPTERPLANE_LORA_FUSED", ("dataplane/kernels/triton/backend.py",), "`1`",
           "`0` or empty: Triton LoRA launches are always two kernels (shrink, expand), "
           "never the fused decode launch; read when the backend is built."),
    EnvVar("ADAPTERPLANE_TRITON_FAST_LAUNCH", ("dataplane/triton_launch.py",), "`1`",
           "`0` or empty: every Triton launch goes through `kernel[grid]` "
           "(`JITFunction.run`) instead of the cached compiled kernel (off anyway under "
           "`TRITON_INTERPRET=1`); read once per process."),
)

TEST_VARIABLES = (
    EnvVar("ADAPTERPLANE_TEST_DATABASE_URL", ("tests/conftest.py", "scripts/test.sh"),
           "`postgresql+psycopg://adapterplane:adapterplane@127.0.0.1:5432/adapterplane_test`",
           "PostgreSQL of the `postgres`-marked tests; `scripts/test.sh` migrates it. "
           "pytest-xdist worker `gwK` uses the database of the same name plus `_gwK` "
           "(`scripts/services.sh` creates them for K < 4; each worker migrates its own)."),
    EnvVar("ADAPTERPLANE_TEST_REDIS_URL", ("tests/conftest.py", "scripts/test.sh"),
           "`redis://127.0.0.1:6379/15`", "Redis of the `redis`-marked tests; xdist worker "
           "`gwK` uses the database number minus K."),
    EnvVar("ADAPTERPLANE_TEST_WORKERS", ("scripts/test.sh",), "`2`",
           "pytest-xdist workers of `scripts/test.sh` (`--dist loadfile`: one test file per "
           "worker at a time); 2 runs the suite in 13 minutes on 2 cores, one process (`0`) "
           "in 19."),
    EnvVar("ADAPTERPLANE_ASSET_CACHE", ("tests/conftest.py",),
           "`adapterplane-assets` beside pytest's temporary directories",
           "Cache of the test model assets (SmolLM2-135M converted from the packaged GGUF)."),
    EnvVar("ADAPTERPLANE_BENCH_DATABASE_URL", ("bench/registry.py",),
           "`postgresql+psycopg://adapterplane:adapterplane@127.0.0.1:5432/adapterplane`",
           "Default `--database-url` of `bench/registry.py`."),
)

INTRO = f"""\
# Configuration

Every process is configured through environment variables; nothing reads a `.env` file
itself (the systemd units in `deploy/systemd/` load `/etc/adapterplane/controlplane.env`
and `/etc/adapterplane/agent-<name>.env` as `EnvironmentFile=`; examples are in
`deploy/*.env.example`). The control plane's settings are `ADAPTERPLANE_<FIELD>`, an
agent's `ADAPTERPLANE_AGENT_<FIELD>` (names are case-insensitive; unknown names and
unknown agent arguments are ignored, so check the spelling). Precedence, highest first:
command-line arguments (an agent's `--<field>=<value>`; `adapterplane api --host/--port`,
`migrate --database-url`, `up --data-dir`), then the environment, then the defaults
below. Values are parsed by pydantic: booleans as `true`/`false`, `1`/`0`, `yes`/`no` or
`on`/`off`, lists as JSON (in the environment only). An empty or unset default is derived
as its description says.

This file is generated from the settings classes (`controlplane/config.py`,
`agent/config.py`) and the list of other variables in `cli/config_docs.py`; do not edit it
by hand. Regenerate it with `{REGENERATE}`; CI runs
`{REGENERATE} --check`.
"""


# ---- rendering ---------------------------------------------------------------------------

def render() -> str:
    """The text of docs/CONFIG.md."""
    parts = [INTRO]
    for section in SECTIONS:
        parts.append(render_section(section))
    parts.append(_render_variables(
        "Other variables",
        "Read with `os.environ` where they are used, not through a settings class (so no "
        "`--key=value` form).", OTHER_VARIABLES))
    parts.append(_render_variables(
        "Tests and benchmarks", "Read by the test suite and the benchmarks only.",
        TEST_VARIABLES))
    return "\n".join(parts)


def env_names(settings: type[BaseSettings]) -> dict[str, str]:
    """Field name -> the environment variable it is read from."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    names = {}
    for name, info in settings.model_fields.items():
        alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
        names[name] = (alias or f"{prefix}{name}").upper()
    return names


def render_section(section: Section) -> str:
    """One settings class's heading, intro and table."""
    cls = section.settings
    defaults = _default_expressions(cls)
    rows = []
    for name, env in env_names(cls).items():
        info = cls.model_fields[name]
        rows.append((_code(env), _type(info), _default(info, defaults.get(name)),
                     _one_line(info.description or "")))
    return "\n".join([
        f"## {section.title} (`{cls.__module__}.{cls.__qualname__}`)", "",
        _wrap(section.intro), "",
        *_table(("Variable", "Type", "Default", "Description"), rows), ""])


def _render_variables(title: str, intro: str, variables: Iterable[EnvVar]) -> str:
    rows = [(_code(v.name), ", ".join(_code(p) for p in v.read_in), v.default, v.meaning)
            for v in variables]
    return "\n".join([f"## {title}", "", _wrap(intro), "",
                      *_table(("Variable", "Read in", "When unset", "Meaning"), rows), ""])


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(_one_line(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(r) for r in rows)]


def _wrap(text: str) -> str:
    return textwrap.fill(_one_line(text), 89, break_long_words=False, break_on_hyphens=False)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# ---- types ----------------------------------------------------------------------------

_TYPE_NAMES: dict[Any, str] = {str: "str", int: "int", float: "float", bool: "bool",
                               Path: "path", SecretStr: "secret"}


def _type(info: FieldInfo) -> str:
    text = _type_name(info.annotation)
    bounds = [_bound(m) for m in info.metadata]
    return ", ".join([text, *filter(None, bounds)])


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(_code(str(a)) for a in args)
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in kept)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type_name(args[0]) if args else 'values'} (JSON)"
    if origin is dict:
        return "object (JSON)"
    if annotation in _TYPE_NAMES:
        return _TYPE_NAMES[annotation]
    return getattr(annotation, "__name__", str(annotation))


def _bound(meta: Any) -> str:
    for kind, attr, symbol in ((annotated_types.Ge, "ge", "≥"), (annotated_types.Gt, "gt", ">"),
                               (annotated_types.Le, "le", "≤"), (annotated_types.Lt, "lt", "<")):
        if isinstance(meta, kind):
            return f"{symbol} {_scalar(getattr(meta, attr), code=False)}"
    return ""


# ---- defaults ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Expr:
    node: ast.expr
    factory: bool


_CONSTANT_NODES = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop,
                   ast.Tuple, ast.List, ast.Set, ast.Dict, ast.expr_context)
_PURE_FACTORIES = {"list": "[]", "dict": "{}", "set": "[]", "tuple": "[]"}


def _default_expressions(cls: type) -> dict[str, _Expr]:
    """Field name -> the default's source expression, from the class bodies (base first)."""
    found: dict[str, _Expr] = {}
    for klass in reversed(cls.__mro__):
        if klass is BaseSettings or not (isinstance(klass, type)
                                         and issubclass(klass, BaseSettings)):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
        for stmt in body.body if body else ():
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and stmt.value is not None):
                expr = _field_default(stmt.value)
                if expr is not None:
                    found[stmt.target.id] = expr
    return found


def _field_default(value: ast.expr) -> _Expr | None:
    if not (isinstance(value, ast.Call) and _name(value.func) in ("Field", "pydantic.Field")):
        return _Expr(value, factory=False)
    for kw in value.keywords:
        if kw.arg in ("default", "default_factory"):
            return _Expr(kw.value, factory=kw.arg == "default_factory")
    if value.args:
        return _Expr(value.args[0], factory=False)
    return None


def _name(node: ast.expr) -> str:
    return ast.unparse(node)


def _default(info: FieldInfo, expr: _Expr | None) -> str:
    if _is_secret(info.annotation):
        return "(secret)"
    if info.is_required():
        return "required"
    if expr is not None and expr.factory:
        return _code(_factory_call(expr.node))
    if expr is not None:
        node = expr.node
        if all(isinstance(n, _CONSTANT_NODES) for n in ast.walk(node)):
            return _value(info.default)
        if (isinstance(node, ast.Call) and _name(node.func) in ("Path", "pathlib.Path")
                and len(node.args) == 1 and not node.keywords
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            return _code(node.args[0].value)
        return _code(ast.unparse(node))
    if info.default_factory is not None:
        return _code(f"{getattr(info.default_factory, '__qualname__', 'factory')}()")
    return _value(info.default)


def _factory_call(node: ast.expr) -> str:
    """What calling the `default_factory` expression `node` evaluates, as source."""
    if isinstance(node, ast.Lambda):
        return ast.unparse(node.body)
    name = _name(node)
    if name in _PURE_FACTORIES:
        return _PURE_FACTORIES[name]
    return f"{name}()" if isinstance(node, ast.Name | ast.Attribute) else f"({name})()"


def _is_secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    return any(_is_secret(a) for a in typing.get_args(annotation))


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, PurePath):
        return _code(value.as_posix())
    if isinstance(value, str):
        return _code(value) if value else '`""`'
    if isinstance(value, bool | int | float):
        return _scalar(value)
    try:
        return _code(json.dumps(value))
    except TypeError:
        return _code(repr(value))


def _scalar(value: Any, code: bool = True) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    shown = _code(text) if code else text
    if not isinstance(value, bool) and isinstance(value, int) and value >= 1024**2:
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2)):
            if value % size == 0:
                return f"{shown} ({value // size} {unit})"
    return shown


# ---- checks ----------------------------------------------------------------------------

_MENTION = re.compile(r"ADAPTERPLANE_[A-Z0-9_]+")


def registry_problems(root: Path = ROOT) -> list[str]:
    """Fields without a description, `ADAPTERPLANE_*` names in the services' sources that
    nothing documents, and listed variables no longer mentioned where they are read."""
    problems = [f"{s.settings.__module__}.{s.settings.__qualname__}.{name} has no description"
                for s in SECTIONS for name, info in s.settings.model_fields.items()
                if not (info.description or "").strip()]
    listed = [*OTHER_VARIABLES, *TEST_VARIABLES]
    for var in listed:
        for rel in var.read_in:
            path = root / rel
            if not path.is_file() or var.name not in path.read_text(errors="replace"):
                problems.append(f"cli/config_docs.py lists {var.name} as read in {rel}, "
                                "which does not mention it")
    known = {v.name for v in listed}
    for section in SECTIONS:
        known.update(env_names(section.settings).values())
    for package in SCANNED_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for name in _MENTION.findall(line):
                    if not name.endswith("_") and name not in known:
                        problems.append(
                            f"{path.relative_to(root)}:{number}: {name} is neither a settings "
                            "field nor listed in cli/config_docs.py (OTHER_VARIABLES)")
    return problems


def check(path: Path) -> list[str]:
    """Everything wrong with `path` as docs/CONFIG.md (empty: it is up to date)."""
    shown = _shown(path)
    problems = []
    expected = render()
    current = path.read_text() if path.is_file() else None
    if current is None:
        problems.append(f"{shown} does not exist; write it with `{REGENERATE}`")
    elif current != expected:
        diff = list(difflib.unified_diff(current.splitlines(), expected.splitlines(),
                                         f"{shown} (checked in)", f"{shown} (generated)",
                                         lineterm=""))
        more = f"\n... ({len(diff) - 60} more diff lines)" if len(diff) > 60 else ""
        problems.append(f"{shown} is out of date with the settings classes; regenerate it "
                        f"with `{REGENERATE}`:\n" + "\n".join(diff[:60]) + more)
    return problems + registry_problems()


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.config_docs",
                                     description="Write or check docs/CONFIG.md.")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the file differs from what would be written")
    parser.add_argument("--path", type=Path, default=ROOT / DOC_PATH,
                        help="the file (default: docs/CONFIG.md of this checkout)")
    args = parser.parse_args(argv)
    path: Path = args.path
    if args.check:
        problems = check(path)
        for problem in problems:
            print(f"config docs: {problem}", file=sys.stderr)
        if not problems:
            print(f"{_shown(path)} is up to date")
        return 1 if problems else 0
    text = render()
    if path.is_file() and path.read_text() == text:
        print(f"{_shown(path)} is up to date")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {_shown(path)}")
    problems = registry_problems()
    for problem in problems:
        print(f"config docs: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
