"""The Celery app. `celery -A controlplane.worker.celery_app worker -Q <queue>` runs it.

`make_celery(settings)` builds an app from settings (JSON only, late acks, tasks
re-queued when a worker dies mid-task, one prefetched task per process, a hard time
limit of `job_time_limit_s` per attempt). The broker's visibility timeout (Redis) is
that limit plus `job_visibility_margin_s`: a message taken by a worker that died is
delivered again after it, while no live attempt can still hold it. Worker start/stop
hooks (scratch dirs, the reaper) are in `lifecycle.py`; a Redis broker goes through
`redis_broker.py` (a dropped connection never kills the worker); the beat schedule (blob garbage
collection, `beat_schedule`) runs only in a worker started with `--beat`. The
module-level `celery_app` (alias `app`) is built lazily from the environment
(`ADAPTERPLANE_*`) on first access.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from celery import Celery

from controlplane.config import Settings
from controlplane.worker import redis_broker

TASK_MODULES = ("controlplane.artifacts.tasks", "controlplane.collections.tasks",
                "controlplane.retention.tasks", "controlplane.merges.tasks")
GC_TASK = "adapterplane.collect_garbage"


def make_celery(settings: Settings) -> Celery:
    redis_broker.install()
    if settings.celery_broker_url.startswith("sqla+sqlite") or (
        settings.celery_result_backend.startswith("db+sqlite")
    ):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = Celery("adapterplane", broker=settings.celery_broker_url,
                 backend=settings.celery_result_backend, include=list(TASK_MODULES))
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.celery_queue,
        task_always_eager=settings.celery_task_always_eager,
        task_ignore_result=False,
        result_expires=24 * 3600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_time_limit=settings.job_time_limit_s,
        broker_transport_options=broker_transport_options(settings),
        beat_schedule=beat_schedule(settings),
        beat_schedule_filename=str(settings.data_dir / "celerybeat-schedule"),
    )
    # Kept off app.conf so configuration dumps (`celery inspect conf`) never show the
    # database URL or storage credentials.
    app.adapterplane_settings = settings
    # register the shared tasks and connect the worker signals
    import controlplane.artifacts.tasks
    import controlplane.collections.tasks
    import controlplane.merges.tasks
    import controlplane.retention.tasks
    import controlplane.worker.lifecycle  # noqa: F401

    return app


def beat_schedule(settings: Settings) -> dict[str, dict[str, object]]:
    """What Celery beat sends (only a worker started with `--beat` runs beat): blob
    garbage collection every `gc_interval_s` (none when 0), to the jobs' queue. Beat
    only sends messages, so it works on every broker, the embedded SQLite one included;
    its last-run times are kept in `<data_dir>/celerybeat-schedule`."""
    if settings.gc_interval_s <= 0:
        return {}
    return {"collect-garbage": {"task": GC_TASK, "schedule": float(settings.gc_interval_s),
                                "options": {"queue": settings.celery_queue}}}


def broker_transport_options(settings: Settings) -> dict[str, int]:
    """Redis redelivery of a message whose worker died: after the visibility timeout
    (`job_time_limit_s + job_visibility_margin_s`), found by a sweep every tenth of it
    (1 to 60 s; kombu's default sweeps only every ~100 s). Redis brokers only: the
    SQLAlchemy transport of the embedded broker hands its options to create_engine,
    which refuses these (the reaper re-enqueues its lost jobs)."""
    if not settings.celery_broker_url.startswith(("redis://", "rediss://")):
        return {}
    visibility = settings.job_time_limit_s + settings.job_visibility_margin_s
    return {"visibility_timeout": visibility,
            "unacked_restore_interval": max(1, min(60, visibility // 10)),
            "unacked_restore_throttle": 1}


@cache
def _default_app() -> Celery:
    return make_celery(Settings())


def __getattr__(name: str) -> Any:
    if name in ("celery_app", "app"):
        return _default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
