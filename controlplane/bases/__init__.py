"""Base models: registered ABI records keyed by H_base."""
