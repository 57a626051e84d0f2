"""Compress-then-Serve collections: submit a fit, run it on a worker, materialize members."""
