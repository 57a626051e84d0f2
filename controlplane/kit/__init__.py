"""Generic plumbing shared by every domain: repositories and keyset pagination."""
