"""Catalog: aliases -> artifacts through append-only, gapless generations."""
