"""Audit log: written with each mutation (service.record_audit), read by admins."""
