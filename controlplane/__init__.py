"""Adapterplane control plane: registry, catalog, admin REST API, validation jobs.

Entry points (what the `adapterplane` console command, `cli.launcher`, wires up):

- `controlplane.app.create_app(settings) -> FastAPI` — the admin API (`adapterplane api`,
  e.g. `uvicorn.run(create_app(Settings()), host=settings.api_host, port=settings.api_port)`).
- `controlplane.migrate.upgrade_to_head(database_url)` — Alembic upgrade to head
  (`adapterplane migrate`); works from a source tree and an installed package.
- `controlplane.auth.service.create_bootstrap_token(session, name) -> str` — first admin
  token, grant `{*, admin}`, committed, plaintext returned once (`adapterplane bootstrap-token`).
  Session: `controlplane.db.make_session_factory(controlplane.db.make_engine(url))()`.
- `controlplane.worker.celery_app.make_celery(settings)` and the lazily built module-level
  `celery_app` — `celery -A controlplane.worker.celery_app worker -Q <settings.celery_queue>`
  (`adapterplane worker`).
- `controlplane.config.Settings` — every setting, env prefix `ADAPTERPLANE_`.
- `controlplane.contracts` — the wire models shared with agents (pydantic and the standard
  library only: the one control-plane module an agent may import).

The control plane never imports `agent` or `cli` (import-linter, pyproject.toml).
"""
