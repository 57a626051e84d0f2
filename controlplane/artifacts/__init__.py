"""Artifacts: push (upload or import), list/get, and the validation job."""
