"""Agents: registration, heartbeats, desired state, slot reports."""
