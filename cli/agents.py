"""`adapterctl agents [list]|show|unbind`: registered agents, their liveness and resident
adapters; `unbind` releases a name from the token bound to it.

Reads `GET /v1/agents` and `GET /v1/agents/{id}` (global read). `state` is the control
plane's: `live` when the agent was heard from within the placement liveness window,
else `stale`. Resident adapters are the slots the agent's last heartbeat reported in
state `active` or `idle`; `loading` and `retiring` slots are shown by `show` only.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from cli import output
from cli.client import ApiClient
from cli.errors import CliError, ExitCode
from cli.invoke import call_and_emit

app = typer.Typer(help="List agents: state, last heartbeat, resident adapters.",
                  invoke_without_command=True)

RESIDENT = ("active", "idle")


def resident(agent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in agent.get("slots") or [] if s.get("state") in RESIDENT]


def render_agents(agents: list[dict[str, Any]]) -> None:
    table = Table(title="agents", header_style="bold")
    for column in ("id", "name", "state", "last heartbeat", "epoch", "catalog", "resident",
                   "url"):
        table.add_column(column, overflow="fold")
    for a in agents:
        digests = ", ".join(output.short(s.get("artifact_digest")) for s in resident(a))
        table.add_row(str(a.get("id")), str(a.get("name")), str(a.get("state", "-")),
                      str(a.get("last_heartbeat_at") or "never"), str(a.get("worker_epoch")),
                      str(a.get("catalog_version")), digests or "-", str(a.get("url")))
    output.stdout_console().print(table)


def render_agent(agent: dict[str, Any]) -> None:
    caps = agent.get("capabilities") or {}
    head = Table(title=f"agent {agent.get('name')}", show_header=False, box=None)
    head.add_column("field", style="bold")
    head.add_column("value", overflow="fold")
    for key in ("id", "state", "url", "base", "worker_epoch", "registered_at",
                "last_heartbeat_at", "catalog_version"):
        head.add_row(key, str(agent.get(key) if agent.get(key) is not None else "-"))
    head.add_row("capabilities", ", ".join(f"{k}={v}" for k, v in sorted(caps.items())))
    console = output.stdout_console()
    console.print(head)
    slots = Table(title="slots", header_style="bold")
    for column in ("slot", "artifact", "state", "refcount", "prefetch", "waiting",
                   "collection"):
        slots.add_column(column)
    for s in agent.get("slots") or []:
        slots.add_row(str(s.get("slot", "-")), output.short(s.get("artifact_digest")),
                      str(s.get("state")), str(s.get("refcount", 0)),
                      str(s.get("prefetch", False)), str(s.get("waiting", 0)),
                      output.short(s.get("collection")))
    console.print(slots)
    for failure in agent.get("load_failures") or []:
        output.note(f"load failure [{failure.get('stage')}] "
                    f"{output.short(failure.get('artifact'))}: {failure.get('error')}")


def find_agent(client: ApiClient, ref: str) -> Any:
    """`ref` is an agent id or a name."""
    if ref.isdigit():
        return client.get(f"/v1/agents/{int(ref)}")
    for agent in client.get("/v1/agents"):
        if agent.get("name") == ref:
            return agent
    raise CliError("NOT_FOUND", f"no agent named {ref!r}", exit_code=ExitCode.NOT_FOUND)


@app.callback()
def agents_root(ctx: typer.Context) -> None:
    """Without a subcommand: the same as `agents list`."""
    if ctx.invoked_subcommand is None:
        call_and_emit(ctx, render_agents, lambda client: client.get("/v1/agents"))


@app.command("list")
def list_command(ctx: typer.Context) -> None:
    """Every registered agent: state, last heartbeat, resident adapters."""
    call_and_emit(ctx, render_agents, lambda client: client.get("/v1/agents"))


@app.command("show")
def show_command(ctx: typer.Context,
                 ref: str = typer.Argument(..., metavar="ID", help="Agent id or name.")) -> None:
    """One agent: capabilities, every slot it reported, recent load failures."""
    call_and_emit(ctx, render_agent, lambda client: find_agent(client, ref))


@app.command("unbind")
def unbind_command(ctx: typer.Context,
                   ref: str = typer.Argument(..., metavar="ID", help="Agent id or name.")) -> None:
    """Release an agent name from the token bound to it (admin on '*'); the next token
    that registers the name owns it."""
    call_and_emit(ctx, render_agent, lambda client: client.post(
        f"/v1/agents/{find_agent(client, ref)['id']}/unbind"))
