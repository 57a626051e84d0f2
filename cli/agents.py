"""`adapterctl agents [list]|show|unbind|drain|undrain|assign`: registered agents, their
state, load and resident adapters; `unbind` releases a name from the token bound to it;
`drain` asks an agent to take no new requests (`--wait`: until its in-flight ones
finished) and `undrain` lifts that; `assign` places a merged release on an agent as its
base (`--wait`: until the agent registered again serving it) or clears that.

Reads `GET /v1/agents` and `GET /v1/agents/{id}` (global read); a name is resolved with
`GET /v1/agents?name=NAME`. `state` is the control plane's: `live` when the agent was
heard from within the placement liveness window, `draining` when asked to drain with
requests still in flight, `drained` when its last heartbeat said nothing is left, else
`stale`. Load is the last heartbeat's: live requests (in the engine), requests waiting
for a cold adapter load, free KV pages of the pool. Resident adapters are the slots the
agent's last heartbeat reported in state `active` or `idle`; `loading` and `retiring`
slots are shown by `show` only.
"""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.table import Table

from cli import output
from cli.client import ApiClient
from cli.context import current
from cli.errors import ApiError, CliError, ExitCode
from cli.invoke import call_and_emit

app = typer.Typer(help="List agents: state, load, last heartbeat, resident adapters; "
                  "drain and undrain them.", invoke_without_command=True)

RESIDENT = ("active", "idle")
DEFAULT_DRAIN_TIMEOUT_S = 300.0
DRAIN_POLL_S = 0.25


def resident(agent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in agent.get("slots") or [] if s.get("state") in RESIDENT]


def load_text(agent: dict[str, Any]) -> str:
    """`2 live, 1 waiting, 180/256 free` from the agent's last reported load."""
    load = agent.get("load") or {}
    text = f"{load.get('live_requests', 0)} live, {load.get('waiting_requests', 0)} waiting"
    if load.get("pool_pages"):
        text += f", {load.get('free_pages', 0)}/{load['pool_pages']} free"
    return text


def release_text(agent: dict[str, Any]) -> str:
    """`NS/name (merge 3), serving` / `..., not serving yet`, or `-` when unassigned."""
    release = agent.get("release")
    if not release:
        return "-"
    serving = "serving" if agent.get("base") == release.get("base") else "not serving yet"
    return f"{release['namespace']}/{release['name']} (merge {release['id']}), {serving}"


def render_agents(agents: list[dict[str, Any]]) -> None:
    table = Table(title="agents", header_style="bold")
    for column in ("id", "name", "state", "load", "last heartbeat", "epoch", "catalog",
                   "resident", "url"):
        table.add_column(column, overflow="fold")
    for a in agents:
        digests = ", ".join(output.short(s.get("artifact_digest")) for s in resident(a))
        table.add_row(str(a.get("id")), str(a.get("name")), str(a.get("state", "-")),
                      load_text(a), str(a.get("last_heartbeat_at") or "never"),
                      str(a.get("worker_epoch")), str(a.get("catalog_version")),
                      digests or "-", str(a.get("url")))
    output.stdout_console().print(table)


def render_agent(agent: dict[str, Any]) -> None:
    caps = agent.get("capabilities") or {}
    head = Table(title=f"agent {agent.get('name')}", show_header=False, box=None)
    head.add_column("field", style="bold")
    head.add_column("value", overflow="fold")
    for key in ("id", "state", "url", "base", "worker_epoch", "registered_at",
                "last_heartbeat_at", "catalog_version", "drain", "drained"):
        head.add_row(key, str(agent.get(key) if agent.get(key) is not None else "-"))
    head.add_row("release", release_text(agent))
    head.add_row("load", load_text(agent))
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
    """`ref` is an agent id or a name (resolved with `GET /v1/agents?name=`)."""
    if ref.isdigit():
        return client.get(f"/v1/agents/{int(ref)}")
    for agent in client.get("/v1/agents", params={"name": ref}):
        if agent.get("name") == ref:
            return agent
    raise CliError("NOT_FOUND", f"no agent named {ref!r}", exit_code=ExitCode.NOT_FOUND)


def wait_drained(client: ApiClient, agent: dict[str, Any], *, timeout_s: float,
                 poll_s: float = DRAIN_POLL_S) -> dict[str, Any]:
    """Poll `GET /v1/agents/{id}` until the agent is `drained`, or the drained process is
    gone (`stale`: no heartbeat within the liveness window; a new worker epoch: another
    process registered; or no longer registered): nothing left to wait for. Raises
    `CliError(WAIT_TIMEOUT)` (exit 9) after `timeout_s`, `CliError(INVALID_STATE)`
    (exit 4) when the drain was lifted meanwhile."""
    deadline = time.monotonic() + timeout_s
    epoch = agent.get("worker_epoch")
    while True:
        if agent.get("drained") or agent.get("state") in ("drained", "stale") or (
                agent.get("worker_epoch") != epoch):
            return agent
        if not agent.get("drain"):
            raise CliError("INVALID_STATE", f"agent {agent.get('name')!r} is no longer "
                           "draining (undrained meanwhile)", detail={"agent": agent})
        if time.monotonic() + poll_s > deadline:
            raise CliError("WAIT_TIMEOUT", f"agent {agent.get('name')!r} still draining after "
                           f"{timeout_s:g}s ({load_text(agent)})", detail={"agent": agent})
        time.sleep(poll_s)
        try:
            agent = client.get(f"/v1/agents/{agent['id']}")
        except ApiError as exc:
            if exc.code == "NOT_FOUND":
                return agent
            raise


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


@app.command("drain")
def drain_command(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="NAME_OR_ID", help="Agent name or id."),
    wait: bool = typer.Option(False, "--wait", help="Wait until the agent has no request "
                              "in flight (drained) or is gone."),
    timeout: float = typer.Option(DEFAULT_DRAIN_TIMEOUT_S, "--timeout",
                                  help="Seconds to wait with --wait (then exit 9)."),
) -> None:
    """Ask an agent to drain (admin on '*' or the agent's own token): routers and its
    readiness probe stop sending it new requests; in-flight ones finish."""
    cli = current(ctx)
    with cli.client() as client:
        agent = client.post(f"/v1/agents/{find_agent(client, ref)['id']}/drain")
        if wait:
            output.note(f"draining agent {agent.get('name')}; waiting for its requests")
            agent = wait_drained(client, agent, timeout_s=timeout)
    output.emit(cli, agent, render_agent)


@app.command("undrain")
def undrain_command(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="NAME_OR_ID", help="Agent name or id."),
) -> None:
    """Lift a drain (admin on '*' or the agent's own token): the agent takes new
    requests again."""
    call_and_emit(ctx, render_agent, lambda client: client.post(
        f"/v1/agents/{find_agent(client, ref)['id']}/undrain"))


def _moves(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether the assignment `after` carries makes the agent restart onto another base."""
    release = after.get("release")
    if release:
        return bool(before.get("base") != release.get("base"))
    was = before.get("release")
    return bool(was and before.get("base") == was.get("base"))


def wait_serving(client: ApiClient, agent: dict[str, Any], *, served: str, timeout_s: float,
                 poll_s: float = DRAIN_POLL_S) -> dict[str, Any]:
    """Poll until a process registered after `agent`'s is live and serves the assigned
    base (the release's; with none assigned, any base other than `served`).
    `CliError(WAIT_TIMEOUT)` (exit 9) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    epoch = agent.get("worker_epoch")
    while True:
        release = agent.get("release")
        base = agent.get("base")
        if agent.get("worker_epoch") != epoch and agent.get("state") != "stale" and (
                base == release.get("base") if release else base != served):
            return agent
        if time.monotonic() + poll_s > deadline:
            raise CliError("WAIT_TIMEOUT", f"agent {agent.get('name')!r} does not serve its "
                           f"assigned base after {timeout_s:g}s", detail={"agent": agent})
        time.sleep(poll_s)
        agent = client.get(f"/v1/agents/{agent['id']}")


@app.command("assign")
def assign_command(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="NAME_OR_ID", help="Agent name or id."),
    release: str | None = typer.Option(None, "--release", metavar="NS/MERGE", help=(
        "The merged release to serve: namespace / merge id or sha256:<H_merged>.")),
    clear: bool = typer.Option(False, "--clear", help="Serve the configured base again."),
    wait: bool = typer.Option(False, "--wait", help="Wait until the agent restarted and "
                              "registered serving the assigned base."),
    timeout: float = typer.Option(DEFAULT_DRAIN_TIMEOUT_S, "--timeout",
                                  help="Seconds to wait with --wait (then exit 9)."),
) -> None:
    """Assign an agent a merged release to serve as its base, or --clear it (admin on
    '*'). The agent drains, restarts itself and loads the release's checkpoint."""
    if (release is None) == (not clear):
        raise CliError("USAGE", "give --release NS/MERGE or --clear", exit_code=ExitCode.USAGE)
    cli = current(ctx)
    with cli.client() as client:
        before = find_agent(client, ref)
        path = f"/v1/agents/{before['id']}/release"
        if release is None:
            agent = client.delete(path)
        else:
            namespace, _, merge = release.partition("/")
            if not namespace or not merge:
                raise CliError("USAGE", f"--release wants NS/MERGE, got {release!r}",
                               exit_code=ExitCode.USAGE)
            agent = client.post(path, json={"namespace": namespace, "release": merge})
        if wait and _moves(before, agent):
            output.note(f"waiting for agent {agent.get('name')} to restart onto its base")
            agent = wait_serving(client, agent, served=str(before.get("base")),
                                 timeout_s=timeout)
    output.emit(cli, agent, render_agent)
