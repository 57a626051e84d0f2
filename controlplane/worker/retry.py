"""Backoff for jobs that retry transient storage errors (validation, collection fits)."""

from __future__ import annotations

from typing import Any

from controlplane.worker.context import WorkerContext


def retry_transient(task: Any, ctx: WorkerContext, exc: Exception) -> Exception:
    """`task.retry(...)` after `validation_retry_backoff_s * 2**retries` (capped), at most
    `validation_max_retries` times; raise what it returns."""
    settings = ctx.settings
    countdown = min(settings.validation_retry_backoff_max_s,
                    settings.validation_retry_backoff_s * 2 ** task.request.retries)
    retry: Exception = task.retry(exc=exc, countdown=countdown,
                                  max_retries=settings.validation_max_retries)
    return retry
