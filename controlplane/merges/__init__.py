"""Immutable merged releases: ordered validated adapters merged into their base (float32
accumulate, one rounding), checked against the live adapters by an exactness gate, and
registered as a new base revision with its lineage."""
