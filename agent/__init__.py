"""The per-device agent: serves LoRA adapters from the control plane's catalog.

Modules, in request order: `http_frontend` (the front process holding the port; it relays
requests over `http_bridge` to the engine process) -> `server` (FastAPI: OpenAI-compatible
API, /metrics, health, state) -> `catalog` (alias resolution at admission, typed HTTP
errors) -> `serving` (engine-loop thread: admission, cold loads, leases, reclamation) ->
the data plane's engine (built by `engine_factory` with `dataplane.engine.build_engine`;
`plan_metrics` is its metrics observer) and `artifacts` (download, digest checks, disk
cache). `daemon` ties them together with `sync` (control-plane client: register,
heartbeat, desired-state long-poll); `config` holds the settings, `metrics` the
Prometheus registry, `supervisor` and `demo` start an agent process and drive it for the
README demo; `tp_ranks` spawns a node's tensor-parallel ranks.

Run: `adapterplane agent` / `python -m agent.daemon [--setting=value ...]`.
"""
