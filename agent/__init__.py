"""The per-device agent: serves LoRA adapters from the control plane's catalog.

Modules, in request order: `server` (FastAPI: OpenAI-compatible API, /metrics, health,
state) -> `catalog` (alias resolution at admission, typed HTTP errors) -> `serving`
(engine-loop thread: admission, cold loads, leases, reclamation) -> `slot_backends`
(`pool_slots`: one unified page pool for KV blocks and adapter factors, engine KV
block i = pool page i; or the engine's own tables) and
`artifacts` (download, digest checks, disk cache). `daemon` ties them together with
`sync` (control-plane client: register, heartbeat, desired-state long-poll);
`config` holds the settings, `metrics` the Prometheus registry, `supervisor` and
`demo` start an agent process and drive it for the README demo.

Run: `adapterplane agent` / `python -m agent.daemon [--setting=value ...]`.
"""
