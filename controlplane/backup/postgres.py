"""Postgres side of backup and restore: `pg_dump`/`pg_restore` and their version checks.

The dump reads an exported snapshot (`pg_export_snapshot()` in a REPEATABLE READ
transaction that stays open while `pg_dump --snapshot` runs), so the caller can read the
same instant's blob references on that transaction. Passwords reach the tools through
`PGPASSWORD`, never the command line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, text
from sqlalchemy.engine import URL

from controlplane.backup.errors import BackupError, TargetNotEmpty, ToolVersionMismatch
from controlplane.db import make_engine, normalize_database_url

_TOOL_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)")

_USER_RELATIONS = text(
    "SELECT n.nspname || '.' || c.relname FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') "
    "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
    "AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1 LIMIT 5")


@dataclass(frozen=True)
class DumpInfo:
    server_version_num: int
    dump_tool_major: int


def tool_major(tool: str) -> int:
    """Major version of `pg_dump`/`pg_restore` on PATH (`ToolVersionMismatch` if absent)."""
    path = shutil.which(tool)
    if path is None:
        raise ToolVersionMismatch(f"{tool} is not on PATH (install the PostgreSQL client)",
                                  detail={"tool": tool})
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    match = _TOOL_VERSION.search(out.stdout)
    if out.returncode != 0 or match is None:
        raise ToolVersionMismatch(f"cannot read the version of {path}: {out.stdout.strip()!r}",
                                  detail={"tool": tool})
    return int(match.group(1))


def server_version_num(conn: Connection) -> int:
    return int(conn.execute(text("SHOW server_version_num")).scalar_one())


def require_tool_for_server(tool: str, server_num: int) -> int:
    """The tool must be at least the server's major version (older clients cannot read
    newer catalogs); returns the tool's major."""
    major = tool_major(tool)
    if major < server_num // 10000:
        raise ToolVersionMismatch(
            f"{tool} {major} is older than the server ({server_num // 10000})",
            detail={"tool": tool, "tool_major": major, "server_version_num": server_num})
    return major


@contextmanager
def exported_snapshot(url: str) -> Iterator[tuple[Connection, str]]:
    """A REPEATABLE READ transaction and the id of its exported snapshot; both stay valid
    until the block ends."""
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                snapshot = str(conn.execute(text("SELECT pg_export_snapshot()")).scalar_one())
                yield conn, snapshot
    finally:
        engine.dispose()


def dump(url: str, snapshot: str, server_num: int, dest: Path) -> DumpInfo:
    """`pg_dump --format=custom` of the whole database of `url` at `snapshot`."""
    major = require_tool_for_server("pg_dump", server_num)
    _run(["pg_dump", "--format=custom", f"--snapshot={snapshot}", f"--file={dest}"], url)
    return DumpInfo(server_version_num=server_num, dump_tool_major=major)


def require_empty(url: str) -> int:
    """Refuse a database that holds any relation outside the system schemas; returns the
    target's `server_version_num`."""
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            found = list(conn.execute(_USER_RELATIONS).scalars())
            num = server_version_num(conn)
    finally:
        engine.dispose()
    if found:
        raise TargetNotEmpty("the target database is not empty; restore needs a fresh one",
                             detail={"relations": found})
    return num


def check_restorable(dump_tool_major: int, source_num: int, target_num: int) -> None:
    """`pg_restore` must read the archive (at least the dumping tool's major) and speak to
    the target; the target server must be no older than the source."""
    restore_major = require_tool_for_server("pg_restore", target_num)
    if restore_major < dump_tool_major:
        raise ToolVersionMismatch(
            f"pg_restore {restore_major} cannot read an archive of pg_dump {dump_tool_major}",
            detail={"tool_major": restore_major, "dump_tool_major": dump_tool_major})
    if target_num // 10000 < source_num // 10000:
        raise ToolVersionMismatch(
            f"target server {target_num // 10000} is older than the source "
            f"{source_num // 10000}",
            detail={"server_version_num": target_num, "source_version_num": source_num})


def restore(url: str, archive: Path) -> None:
    """`pg_restore` in one transaction: all of the dump or nothing. Ownership and grants
    are the restoring role's (the target stack's role need not be the source's)."""
    _run(["pg_restore", "--exit-on-error", "--single-transaction", "--no-owner",
          "--no-privileges", str(archive)], url)


def _run(args: list[str], url: str) -> None:
    env, dbname = _libpq_env(normalize_database_url(url))
    cmd = [args[0], f"--dbname={dbname}", "--no-password", *args[1:]]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise BackupError(f"{args[0]} failed ({out.returncode}): {out.stderr.strip()[-2000:]}",
                          detail={"tool": args[0], "returncode": out.returncode})


def _libpq_env(url: URL) -> tuple[dict[str, str], str]:
    env = dict(os.environ)
    for name, value in (("PGHOST", url.host), ("PGPORT", url.port), ("PGUSER", url.username),
                        ("PGPASSWORD", url.password)):
        if value is not None:
            env[name] = str(value)
    sslmode = url.query.get("sslmode")
    if isinstance(sslmode, str):
        env["PGSSLMODE"] = sslmode
    return env, url.database or ""
