"""Celery worker: app factory (`celery_app.py`) and enqueue-after-commit (`jobs.py`)."""
