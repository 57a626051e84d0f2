"""Namespaces: created by admins; scopes are granted per namespace."""
