"""`adapterplane`: the server-side console script (`cli.launcher:main`).

Subcommands: `migrate` (Alembic to head), `api` (uvicorn on `controlplane.app:create_app`),
`worker` (Celery worker of `controlplane.worker`), `bootstrap-token` (first admin token,
straight into the DB), `up` (the embedded stack: API + worker as real processes),
`backup`/`restore` (database + blobs, cli/backup.py), `demo` (the README's first command)
and `agent` (the per-device daemon, agent/daemon.py).

Settings are `controlplane.config.Settings` (environment, prefix `ADAPTERPLANE_`); the
embedded default keeps SQLite, file:// objects and a SQLite Celery broker under
`ADAPTERPLANE_DATA_DIR` (default `./var`). Heavy imports happen inside the commands so
`adapterplane --help` stays instant.

The launcher sits above the control plane and the agent in the import graph (it starts
both); neither imports it. From the agent it reaches only `agent.daemon.main` (pyproject's
import-linter contracts).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli.backup import backup_command, restore_command

if TYPE_CHECKING:
    from controlplane.config import Settings

app = typer.Typer(
    name="adapterplane",
    help="Adapterplane control plane: migrations, API server, worker, embedded stack, demo.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _settings(**overrides: Any) -> Settings:
    from controlplane.config import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command("migrate")
def migrate_command(
    database_url: str | None = typer.Option(
        None, "--database-url", help="Default: ADAPTERPLANE_DATABASE_URL or the embedded SQLite."
    ),
) -> None:
    """Upgrade the database schema to the newest Alembic revision."""
    from controlplane.migrate import upgrade_to_head

    url = database_url or _settings().database_url
    upgrade_to_head(url)
    typer.echo(f"database at head: {_redacted(url)}", err=True)


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@app.command("api")
def api_command(
    host: str | None = typer.Option(None, "--host", help="Default: ADAPTERPLANE_API_HOST."),
    port: int | None = typer.Option(None, "--port", help="Default: ADAPTERPLANE_API_PORT."),
    workers: int = typer.Option(1, "--workers", min=1, help="uvicorn worker processes."),
    log_level: str = typer.Option("info", "--log-level"),
    access_log: bool = typer.Option(False, "--access-log/--no-access-log"),
) -> None:
    """Serve the admin REST API with uvicorn (graceful shutdown on SIGTERM/SIGINT)."""
    import uvicorn

    settings = _settings()
    uvicorn.run(
        # zero-argument factory (`--factory`): builds the app on environment settings, with
        # its own scratch root, in every uvicorn worker process
        "controlplane.app:create_server_app",
        factory=True,
        host=host or settings.api_host,
        port=port or settings.api_port,
        workers=workers,
        log_level=log_level,
        access_log=access_log,
    )


def _celery_app() -> Any:
    """The module-level Celery app (`controlplane.worker.celery_app`), built from settings."""
    from controlplane.worker.celery_app import celery_app

    return celery_app


@app.command("worker")
def worker_command(
    concurrency: int = typer.Option(1, "--concurrency", min=1),
    pool: str = typer.Option("prefork", "--pool", help="prefork | solo | threads"),
    loglevel: str = typer.Option("INFO", "--loglevel"),
    ready_file: Path | None = typer.Option(
        None, "--ready-file", help="Touched when the worker is consuming; removed on exit."
    ),
    beat: bool = typer.Option(
        False, "--beat", help="Also run Celery beat (blob GC every ADAPTERPLANE_GC_INTERVAL_S); "
        "start exactly one worker with it."),
) -> None:
    """Run a Celery worker for the validation jobs (broker from settings)."""
    celery_app = _celery_app()
    if ready_file is not None:
        _signal_readiness(ready_file)
    celery_app.worker_main(
        argv=[
            "worker",
            f"--loglevel={loglevel}",
            f"--concurrency={concurrency}",
            f"--pool={pool}",
            "--without-gossip",
            "--without-mingle",
            *(["--beat"] if beat else []),
        ]
    )


def _signal_readiness(ready_file: Path) -> None:
    from celery.signals import worker_ready, worker_shutdown

    def on_ready(**_: Any) -> None:
        ready_file.parent.mkdir(parents=True, exist_ok=True)
        ready_file.write_text(str(os.getpid()))

    def on_shutdown(**_: Any) -> None:
        ready_file.unlink(missing_ok=True)

    worker_ready.connect(on_ready, weak=False)
    worker_shutdown.connect(on_shutdown, weak=False)


@app.command("agent", context_settings={"allow_extra_args": True,
                                        "ignore_unknown_options": True,
                                        "help_option_names": []})
def agent_command(ctx: typer.Context) -> None:
    """The per-device agent (settings: ADAPTERPLANE_AGENT_* or --name=value; --help lists them)."""
    from agent.daemon import main as agent_main

    raise typer.Exit(agent_main(ctx.args))


@app.command("router", context_settings={"allow_extra_args": True,
                                         "ignore_unknown_options": True,
                                         "help_option_names": []})
def router_command(ctx: typer.Context) -> None:
    """The fleet's OpenAI-compatible front door (settings: ADAPTERPLANE_ROUTER_* or
    --name=value; --help lists them)."""
    from agent.router.server import main as router_main

    raise typer.Exit(router_main(ctx.args))


@app.command("bootstrap-token")
def bootstrap_token_command(
    name: str = typer.Option("admin", "--name"),
    write_to: Path | None = typer.Option(
        None, "--write-to", help="Write the token to this file (mode 0600) instead of stdout."
    ),
) -> None:
    """Create an admin token (grant `*:admin`) directly in the database; print it once."""
    from controlplane.auth.service import create_bootstrap_token
    from controlplane.db import make_engine, make_session_factory

    settings = _settings()
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            token = create_bootstrap_token(session, name)
            session.commit()
    finally:
        engine.dispose()
    if write_to is None:
        typer.echo(token)
        return
    write_to.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(write_to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    typer.echo(f"admin token written to {write_to}", err=True)


@app.command("reap-jobs")
def reap_jobs_command(
    older_than_s: int | None = typer.Option(
        None, "--older-than-s", min=0,
        help="Rows busy longer than this (default ADAPTERPLANE_JOB_REAP_AFTER_S)."),
) -> None:
    """Send again the jobs of artifacts and collections stuck validating/fitting (what
    every worker's reaper does periodically); prints the row ids per kind as JSON."""
    import json

    from controlplane.db import make_engine, make_session_factory
    from controlplane.worker.celery_app import make_celery
    from controlplane.worker.context import dispose_worker_context
    from controlplane.worker.jobs import JobQueue
    from controlplane.worker.reaper import reap_stuck_jobs

    settings = _settings()
    if older_than_s is not None:
        settings = settings.model_copy(update={"job_reap_after_s": older_than_s})
    engine = make_engine(settings.database_url, pool_size=1)
    celery = make_celery(settings)
    try:
        sent = reap_stuck_jobs(make_session_factory(engine),
                               JobQueue(celery, settings.celery_queue), settings)
    finally:
        dispose_worker_context(celery)
        engine.dispose()
    typer.echo(json.dumps(sent))


@app.command("up")
def up_command(
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Default: ADAPTERPLANE_DATA_DIR or ./var."
    ),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8400, "--port", help="0 picks a free port."),
) -> None:
    """Run the embedded stack (API + worker) until Ctrl-C or SIGTERM, then stop it cleanly."""
    from cli.stack import EmbeddedStack, StackError

    directory = data_dir or Path(os.environ.get("ADAPTERPLANE_DATA_DIR", "./var"))
    stack = EmbeddedStack(directory, host=host, port=port)
    # SIGTERM while starting behaves like Ctrl-C: start() stops what it began, re-raises.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        stack.start()
        stopping = _StopFlag()
        typer.echo(f"Adapterplane is up at {stack.url}")
        typer.echo(f"admin token: {stack.token_path}")
        typer.echo(f"  export ADAPTERPLANE_URL={stack.url}")
        typer.echo(f"  export ADAPTERPLANE_TOKEN=$(cat {stack.token_path})")
        typer.echo(f"logs: {stack.log_dir}  (Ctrl-C to stop)", err=True)
        while not stopping.requested:
            stack.check_alive()
            time.sleep(0.3)
    except StackError as exc:
        stack.stop()
        raise _fail(str(exc)) from exc
    except KeyboardInterrupt:
        if not stack.running:
            raise _fail("interrupted while starting; everything started was stopped", 130) from None
    report = stack.stop()
    typer.echo(f"stopped {report.describe()}", err=True)
    if not report.clean:
        raise typer.Exit(1)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


class _StopFlag:
    """Turns SIGTERM/SIGINT into a flag the supervision loop checks (no traceback)."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._request)

    def _request(self, *_: Any) -> None:
        self.requested = True


@app.command("demo")
def demo_command(
    data_dir: Path = typer.Option(
        Path("./var/demo"), "--data-dir", help="Wiped and recreated for every run."
    ),
    models_dir: Path = typer.Option(
        Path("./var/models"), "--models-dir", help="Cache of the converted base model."
    ),
) -> None:
    """Run the end-to-end demo on a fresh embedded stack (see cli/demo.py)."""
    from cli.demo import run_demo
    from cli.errors import CliError
    from cli.stack import StackError

    try:
        run_demo(data_dir=data_dir, models_dir=models_dir)
    except CliError as exc:
        raise _fail(f"{exc.code}: {exc.message}", int(exc.exit_code)) from exc
    except StackError as exc:
        raise _fail(str(exc)) from exc


app.command("backup")(backup_command)
app.command("restore")(restore_command)


def main() -> None:
    from controlplane.kit.log_redaction import install_log_redaction

    install_log_redaction()  # api, worker and agent alike: no presigned URL in any log
    app()


if __name__ == "__main__":
    main()
