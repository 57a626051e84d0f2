"""Placement: which agents keep which adapters resident."""
