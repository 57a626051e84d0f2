"""Retention: blob garbage collection (`collector.py`), the leases that fence it off
from pushes and fits in flight (`leases.py`), what rows reference (`references.py`), the
`POST /v1/gc` route and the periodic Celery task run by beat."""
