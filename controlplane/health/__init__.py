"""Liveness (/healthz) and readiness (/readyz: database + object storage)."""
