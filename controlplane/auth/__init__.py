"""Bearer-token authentication and per-namespace scopes (read < publish < admin)."""
