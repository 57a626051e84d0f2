"""`adapterplane agent`: the per-device daemon.

Start-up: load the base model into the engine, start the engine loop, serve HTTP (a
front process holds the port and relays requests to this process's app over a Unix
socket: agent/http_bridge.py) and run two background threads:

* **sync**: register with the control plane (capabilities + a fresh worker epoch,
  assigned by the control plane at each registration), then long-poll desired state
  (`after` = the last applied catalog version, `tenants_after` = the last applied
  tenant-policy version), apply it to the catalog replica, reconcile residency
  (prefetch what placement assigns, reclaim what is no longer named) and hand the
  engine every namespace's scheduling weight and priority class when they changed. A
  publish or a policy change reaches the agent within the control plane's 100 ms check.
* **heartbeat**: report slot states, load failures and load (live requests, requests
  waiting for a cold load, free KV pages) every `heartbeat_interval_s`. A 409
  STALE_EPOCH (a newer process took over this agent name) stops this process from
  serving: it turns not-ready and exits.

Drain: when a heartbeat answer says `drain` (an operator's `adapterctl agents drain`,
or a preStop hook with this agent's token), `/readyz` answers 503 `draining` (so a
Kubernetes Service stops sending traffic; routers already skip the agent), requests
that still reach the agent are served as before, and the heartbeat checks every
`DRAIN_CHECK_S` so the report that it is `drained` (draining, nothing live or waiting)
goes out as soon as the last request ends. An answer without `drain` ends draining.

With `tp_degree > 1` the agent is rank 0 of its node's TP group; if a follower rank dies
the agent exits with status 70 at once (`EXIT_TP_RANK_LOST`) instead of hanging in its
next collective, and its supervisor restarts the group.

Base assignment: the base the agent serves is the merged release an operator assigned
its name (`adapterctl agents assign`, looked up before the model loads), else
`base_release`, else `model_dir`. When a heartbeat answer names another one
(`release_base`), the agent drains itself (routers stop sending it requests), and once
nothing is in flight (or after `shutdown_grace_s`) it stops and re-executes itself with
the same command line, which loads the newly assigned base and registers again with its
H_base. A release whose checkpoint cannot be fetched at start is logged and not retried
by this process: it serves its configured base, and `adapterctl agents show` shows the
assignment it is not serving.

Nothing about adapters survives a restart except verified cache files: the new process
re-derives its state from the control plane and re-checks every digest it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.artifacts import ArtifactFetcher
from agent.base_release import ReleaseUnavailable, check_served_base, fetch_base_release
from agent.catalog import AgentCatalog, parse_desired_state, tenant_policy
from agent.config import AgentSettings, command_line
from agent.engine_factory import agent_engine
from agent.engine_thread import EngineThread
from agent.http_bridge import serve_bridge
from agent.metrics import AgentMetrics
from agent.server import ServingContext, create_agent_app
from agent.serving import EngineLoop
from agent.sync import LEAVE_TIMEOUT_S, ControlPlaneClient, ControlPlaneError
from controlplane.contracts import Capabilities, HeartbeatRequest, RegisterRequest
from dataplane.engine.adapters import ADAPTABLE_MODULES
from dataplane.pool.faults import FaultInjector

log = logging.getLogger("adapterplane.agent")

EXIT_TP_RANK_LOST = 70
"""Exit status when a tensor-parallel follower rank died (EX_SOFTWARE)."""
DRAIN_CHECK_S = 0.2
"""While draining, how often the heartbeat loop checks whether the agent is drained."""
RATE_WINDOW_S = 30.0
"""Time constant of the per-adapter request-rate average heartbeats report."""


class AgentDaemon:
    def __init__(self, settings: AgentSettings) -> None:
        self.client = ControlPlaneClient(settings.control_plane_url,
                                         settings.token.get_secret_value(),
                                         settings.auth_cache_s, settings.auth_stale_s)
        self.release = settings.base_release
        """H_base of the merged release served ("": `model_dir`)."""
        self._unservable: str | None = None
        """An assigned release that could not be fetched at start."""
        assigned = self._assigned_release(settings.name)
        release_dir: Path | None = None
        if assigned and assigned != self.release:
            try:
                release_dir = fetch_base_release(self.client, assigned, settings.cache_dir)
                self.release = assigned
            except (ReleaseUnavailable, ControlPlaneError) as exc:
                log.error("assigned merged release %s cannot be served (%s); serving the "
                          "configured base", assigned, exc)
                self._unservable = assigned
        if self.release and release_dir is None:
            release_dir = fetch_base_release(self.client, self.release, settings.cache_dir)
        if release_dir is not None:
            settings = settings.model_copy(update={"model_dir": release_dir})
        self.settings = settings
        self.restart = False
        """Set when the process stops to re-execute itself onto a newly assigned base."""
        self._moving_since: float | None = None
        """monotonic time the agent began draining to move to another base."""
        self.metrics = AgentMetrics()
        self.faults = FaultInjector.from_env()
        """`ADAPTERPLANE_FAULTS` (off unless set): pool copy/validate/publish + download."""
        self.engine_thread = EngineThread()
        """Builds the engine, then runs its loop: steps run where the engine was made."""
        self.engine, self.tp_ranks = self.engine_thread.call(agent_engine, settings,
                                                             self.metrics, self.faults)
        self._rates_at = time.monotonic()
        self._rates_seen: dict[str, int] = {}
        """Admitted requests per digest at the last heartbeat (for `rate`)."""
        self._rates: dict[str, float] = {}
        """Smoothed admitted requests/s per digest."""
        abi = self.engine.base_abi
        if abi is None:
            raise RuntimeError("the engine has no base ABI")
        if self.release:
            check_served_base(abi.h_base, self.release)
        self.abi = abi
        self.catalog = AgentCatalog()
        self.fetcher = ArtifactFetcher(settings.cache_dir, abi, settings.max_rank,
                                       delay_load_s=settings.fault_delay_load_s,
                                       faults=self.faults,
                                       native_collections=bool(self.engine.runner.collections))
        self.loop = EngineLoop(self.engine, self.fetcher, self.catalog, self.metrics,
                               settings.max_slots, settings.max_queued_requests,
                               settings.fault_step_delay_s,
                               load_attempts=settings.load_attempts,
                               cold_reserve_after_s=settings.cold_reserve_after_ms / 1000,
                               thread=self.engine_thread)
        every = ADAPTABLE_MODULES
        self.targets = frozenset(settings.adapter_targets) & every or every
        self.ctx = ServingContext(
            catalog=self.catalog, loop=self.loop, metrics=self.metrics, client=self.client,
            served_model_name=settings.served_model_name or settings.model_dir.resolve().name,
            max_rank=settings.max_rank, targets=self.targets, h_base=abi.h_base,
            require_auth=settings.require_auth, max_queue_ms=settings.max_queue_ms,
            max_tokens_limit=settings.max_tokens_limit,
            state={"ready": False, "draining": False, "agent_id": None, "worker_epoch": None,
                   "name": settings.name})
        self.app = create_agent_app(self.ctx)
        self._stop = threading.Event()
        self._fenced_out = False
        self.ctx.state["lora_fold_rows"] = self.engine.model.lora_fold_rows
        if self.engine.model.lora_fold_slots is not None:
            self.metrics.watch_fold(self.engine.model.lora_fold_slots)
        ranks = self.tp_ranks
        if ranks is not None:  # this agent is rank 0 of a TP group
            self.ctx.state["tp_follower_pids"] = ranks.follower_pids()
            self.metrics.watch_collectives(ranks.group.counter)
            ranks.watch(self._tp_rank_lost)
        self._full_due = 0.0
        """monotonic time by which the next poll asks for a full desired state"""
        self._tenants: dict[str, tuple[float, str]] | None = None
        """The tenant policy last handed to the engine loop, and the version it is of."""
        self._tenants_version = 0

    # ---- control-plane protocol ------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """Pool geometry in KV-block pages. One GPU: one unified pool of `num_kv_blocks`
        pages for KV and adapters, of which placement may fill at most `max_slots`
        worst-case (max rank, every module) adapters; a TP group: the same, per rank at
        the rank's local sizes (every rank's pool mirrors rank 0's placement)."""
        s, c = self.settings, self.engine.model.config
        elem = self.engine.model.embed_tokens.weight.element_size()
        page_bytes = 2 * c.num_layers * s.block_size * c.num_kv_heads * c.head_dim * elem
        slot_bytes = sum(s.max_rank * (d_in + d_out) * elem
                         for d_out, d_in in c.module_shapes.values()) * c.num_layers
        slot_pages = -(-slot_bytes // page_bytes)
        pool = self.engine.pool
        if pool.max_slots > 0:
            pool_pages, page_bytes = pool.layout.total_pages, pool.layout.geometry.page_bytes
            slot_pages = -(-slot_bytes // page_bytes)
            reserve = max(0, pool_pages - s.max_slots * slot_pages)
        else:  # LoRA off: every page is KV
            pool_pages = reserve = s.num_kv_blocks
        return Capabilities(base=self.abi.h_base, dtypes=[s.dtype], max_rank=s.max_rank,
                            targets=sorted(self.targets), adapter_slots=s.max_slots,
                            pool_pages=pool_pages, page_bytes=page_bytes,
                            kv_reserve_pages=reserve, tp_degree=s.tp_degree,
                            served_model_name=self.ctx.served_model_name)

    def register(self) -> None:
        self.ctx.served_model_name = self.served_model_name()
        me = self.client.register(RegisterRequest(name=self.settings.name, url=self.settings.url,
                                                  capabilities=self.capabilities()))
        self.ctx.state.update(agent_id=me.id, worker_epoch=me.worker_epoch)
        log.info("registered as agent %s epoch %s", me.id, me.worker_epoch)

    def served_model_name(self) -> str:
        """The `model` value of the bare base: `served_model_name` when set, else the name
        the base was registered under (looked up again at every registration), else, while
        it is not registered, the model directory's name."""
        if self.settings.served_model_name:
            return self.settings.served_model_name
        registered = self.client.base_name(self.abi.h_base)
        return registered or self.settings.model_dir.resolve().name

    def sync_once(self, wait_s: float) -> None:
        """One long-poll. Incremental (`since` = the replica's version) once a full state
        is held, and full again before the download URLs it carried expire."""
        state = self.ctx.state
        after = self.catalog.version if state["ready"] else -1
        now = time.monotonic()
        full = not state["ready"] or now >= self._full_due
        doc = self.client.desired_state(state["agent_id"], state["worker_epoch"], after, wait_s,
                                        since=-1 if full else self.catalog.version,
                                        tenants_after=self._tenants_version
                                        if state["ready"] else None)
        version, aliases = parse_desired_state(doc)
        if doc.full:
            self.catalog.update(version, aliases)
            self._full_due = now + doc.url_ttl_s / 2
        else:  # also when nothing changed: placement may move
            self.catalog.merge(version, aliases, set(doc.prefetch))
        self.loop.reconcile()
        tenants = tenant_policy(doc)  # complete in full and incremental states
        if tenants != self._tenants:
            self.loop.set_tenant_policy(tenants)
            self._tenants = tenants
        self._tenants_version = doc.tenants_version
        state["ready"] = True

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.ctx.state["agent_id"] is None:
                    self.register()
                self.sync_once(self.settings.long_poll_s)
            except ControlPlaneError as exc:
                if exc.code == "STALE_EPOCH":
                    self._fenced()
                    return
                if exc.code == "AGENT_NAME_BOUND":
                    log.error("%s; this process stops", exc)
                    self._stop.set()
                    return
                log.warning("control plane: %s", exc)
                self._stop.wait(0.5)
            except Exception:
                log.exception("sync failed")
                self._stop.wait(0.5)

    def drained(self) -> bool:
        """Asked to drain, and no request live in the engine or waiting for a load."""
        status = self.loop.status
        waiting = sum(int(s.get("waiting", 0)) for s in status.get("slots", []))
        return bool(self.ctx.state.get("draining")) and status.get("live", 0) == 0 and (
            waiting == 0)

    def heartbeat_once(self, timeout: float | None = None) -> bool | None:
        """Send one report; the `drained` it carried (None when not registered yet)."""
        state, status = self.ctx.state, self.loop.status
        if state["agent_id"] is None:
            return None
        slots = self._with_rates(status.get("slots", []), status.get("requests", {}))
        drained = self.drained()
        try:  # the agent's own report; extra keys (kernel_local) are not part of it
            report = HeartbeatRequest.model_validate({
                "worker_epoch": state["worker_epoch"], "catalog_version": self.catalog.version,
                "live_requests": status.get("live", 0),
                "waiting_requests": sum(int(s.get("waiting", 0)) for s in slots),
                "free_pages": status.get("free_pages", 0),
                "pool_pages": status.get("pool_pages", 0), "drained": drained,
                "slots": slots, "load_failures": status.get("load_failures", [])})
        except ValidationError as exc:
            raise ControlPlaneError(f"heartbeat report does not fit the contract: {exc}",
                                    422, "VALIDATION_ERROR") from exc
        answer = self.client.heartbeat(state["agent_id"], report, timeout)
        self._follow_assignment(answer.release_base or self.settings.base_release)
        draining = answer.drain or self._moving_since is not None
        if draining != bool(state.get("draining")):
            log.info("control plane: %s", "drain" if draining else "drain lifted")
            state["draining"] = draining
        return drained

    def _assigned_release(self, name: str) -> str:
        """The merged release the control plane assigns this agent's name ("": none, or
        the control plane cannot say now; a later heartbeat answer corrects it)."""
        try:
            return self.client.assigned_release(name) or ""
        except ControlPlaneError as exc:
            log.warning("cannot look up this agent's base assignment: %s", exc)
            return ""

    def _follow_assignment(self, wanted: str) -> None:
        """Drain to move when the assigned base is not the served one; undrain when the
        assignment returns to it before the move."""
        agent_id = self.ctx.state["agent_id"]
        moving = wanted != self.release and wanted != self._unservable
        if moving and self._moving_since is None:
            log.info("assigned base %s (serving %s): draining to restart onto it",
                     wanted or "of model_dir", self.release or self.abi.h_base)
            self._moving_since = time.monotonic()
            self.client.drain(agent_id)  # routers skip it from now on
        elif not moving and self._moving_since is not None:
            log.info("the assignment is the served base again: undraining")
            self._moving_since = None
            self.client.undrain(agent_id)

    def _restart_due(self, drained: bool | None) -> bool:
        since = self._moving_since
        return since is not None and (
            bool(drained) or time.monotonic() - since >= self.settings.shutdown_grace_s)

    def _with_rates(self, slots: list[dict[str, Any]], requests: Mapping[str, int]
                    ) -> list[dict[str, Any]]:
        """`slots` with each adapter's admitted requests/s, smoothed over
        :data:`RATE_WINDOW_S` (an exponential moving average), so a short burst does not
        look like sustained demand to placement's replica count."""
        now = time.monotonic()
        elapsed = max(now - self._rates_at, 1e-6)
        keep = math.exp(-elapsed / RATE_WINDOW_S)
        seen, smoothed = self._rates_seen, self._rates
        for digest in set(requests) | set(smoothed):
            instant = max(0, requests.get(digest, 0) - seen.get(digest, 0)) / elapsed
            smoothed[digest] = smoothed.get(digest, 0.0) * keep + instant * (1 - keep)
        self._rates_at, self._rates_seen = now, dict(requests)
        return [{**s, "rate": round(smoothed.get(str(s.get("artifact_digest")), 0.0), 6)}
                for s in slots]

    def _heartbeat_loop(self) -> None:
        """Every `heartbeat_interval_s`; while draining, also as soon as `drained()`
        differs from what the last report said (checked every `DRAIN_CHECK_S`)."""
        interval = self.settings.heartbeat_interval_s
        due = time.monotonic() + interval
        sent: bool | None = None
        while not self._stop.wait(min(DRAIN_CHECK_S, max(0.0, due - time.monotonic()))):
            if time.monotonic() < due and not (
                    self.ctx.state.get("draining") and self.drained() != sent):
                continue
            due = time.monotonic() + interval
            try:
                sent = self.heartbeat_once()
                if self._restart_due(sent):
                    log.info("drained: restarting onto the assigned base")
                    self.restart = True
                    self._stop.set()
                    return
            except ControlPlaneError as exc:
                if exc.code == "STALE_EPOCH":
                    self._fenced()
                    return
                log.warning("heartbeat: %s", exc)
                sent = self.drained()  # retried at the interval, not every check

    def leave(self) -> None:
        """A clean exit: drain this agent in the control plane and report it drained, so
        placement moves its adapters and routers drop it at once rather than after its
        heartbeat lapses (a restart registers again, which clears the drain). A fenced
        process leaves nothing: its id belongs to the newer process. Best effort."""
        if self._fenced_out or self.ctx.state["agent_id"] is None:
            return
        try:
            # STALE_EPOCH here: a newer process took the name
            self.heartbeat_once(LEAVE_TIMEOUT_S)
            self.client.drain(self.ctx.state["agent_id"])
            self.ctx.state["draining"] = True
            self.heartbeat_once(LEAVE_TIMEOUT_S)
        except ControlPlaneError as exc:
            log.warning("leaving: %s (the control plane drops this agent when its "
                        "heartbeat lapses)", exc)

    def _fenced(self) -> None:
        self._fenced_out = True
        log.error("a newer process registered as %s; this one stops serving",
                  self.settings.name)
        self.ctx.state["ready"] = False
        self._stop.set()

    def _tp_rank_lost(self, reason: str) -> None:
        """A TP follower died: the group is broken (rank 0's next collective would wait for
        the process group's timeout), so stop serving now and exit non-zero; the
        supervisor restarts the agent, which starts a fresh group. Requests in flight
        fail with the connection; none is answered by a partial model."""
        log.error("%s: the TP group is broken; this agent stops serving and exits (%d)",
                  reason, EXIT_TP_RANK_LOST)
        self.ctx.state["ready"] = False
        if self.tp_ranks is not None:
            self.tp_ranks.kill_followers()
        logging.shutdown()
        os._exit(EXIT_TP_RANK_LOST)

    # ---- process ---------------------------------------------------------------------
    def start_background(self) -> None:
        self.loop.start()
        for target in (self._sync_loop, self._heartbeat_loop):
            threading.Thread(target=target, name=target.__name__, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.loop.stop()
        if self.tp_ranks is not None:  # tensor-parallel follower processes of this node
            self.tp_ranks.shutdown()
        self.client.close()

    def serve(self) -> None:
        """Serve HTTP until a signal, a fence or a restart: the front process
        (agent/http_frontend.py) holds the port and relays requests to this process's app
        over a Unix socket (agent/http_bridge.py). SIGTERM / SIGINT drain: `/readyz`
        turns 503 and requests in flight get `shutdown_grace_s` to finish. Raises
        SystemExit when the front process failed on its own (e.g. the port was taken)."""
        self.start_background()
        freeze_startup_heap()
        try:
            with tempfile.TemporaryDirectory(prefix="adapterplane-agent-") as private:
                failed = asyncio.run(self._serve_http(os.path.join(private, "http.sock")))
            if failed is not None:
                raise SystemExit(failed)
            self.leave()
        finally:
            self.stop()

    async def _serve_http(self, socket_path: str) -> int | None:
        """Run the bridge and the front process until the front exits; its exit status
        when nobody asked it to stop, else None."""
        loop = asyncio.get_running_loop()
        bridge = await serve_bridge(self.app, socket_path)
        grace = math.ceil(self.settings.shutdown_grace_s)
        front = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent.http_frontend", "--socket", socket_path,
            "--host", self.settings.host, "--port", str(self.settings.port),
            "--grace", str(grace))
        asked = False

        def drain(reason: str) -> None:
            nonlocal asked
            if not asked:
                asked = True
                # a load balancer sees 503 on /readyz while in-flight requests finish
                self.ctx.state["ready"] = False
                log.info("%s: draining (at most %ds)", reason, grace)
                with contextlib.suppress(ProcessLookupError):
                    front.terminate()

        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, drain, f"signal {sig.name}")
        fence = loop.run_in_executor(None, self._stop.wait)
        fence.add_done_callback(lambda _: drain("stopping") if front.returncode is None else None)
        try:
            rc = await front.wait()
        finally:
            self._stop.set()  # ends the fence watch
            if in_main:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            bridge.close()
        if asked:
            return None
        log.error("the HTTP front process exited with status %s", rc)
        return 1


GIL_SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval in the agent (Python's default is 5 ms). The
engine thread gives up the GIL at every torch call and needs it back to go on; while the
server thread streams tokens, getting it back waits up to one switch interval."""


def freeze_startup_heap() -> None:
    """Move what startup built (model modules, app, catalog, tokenizer: hundreds of
    thousands of objects) out of the cyclic collector's reach before serving. A full
    collection otherwise scans all of it, a pause of ~100 ms on the CPU during which
    every stream stalls; after the freeze it scans only what serving allocates."""
    gc.collect()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent with settings from the environment (`ADAPTERPLANE_AGENT_*`).

    `argv` accepts `--KEY=VALUE` overrides of any setting (e.g. `--port=8501`).
    """
    settings = command_line(AgentSettings, argv or (), "agent")
    if settings is None:
        return 0
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    daemon = AgentDaemon(settings)
    log.info("engine ready in %.1fs", time.monotonic() - started)
    daemon.serve()
    if daemon.restart:
        restart_process()
    return 0


def restart_process() -> None:
    """Replace this process with a fresh run of the same command line (same pid, same
    environment): the new process loads the base it is assigned now. Sockets are not
    inherited (Python opens them non-inheritable), so the port is free again."""
    argv = [sys.executable, *sys.orig_argv[1:]]
    log.info("re-executing: %s", " ".join(argv))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
