"""Celery worker: app factory (`celery_app.py`), enqueue-after-commit (`jobs.py`), retry of
transient faults (`retry.py`), the reaper of stuck jobs (`reaper.py`), per-process scratch
dirs (`scratch.py`) and the worker start/stop hooks that run them (`lifecycle.py`)."""
