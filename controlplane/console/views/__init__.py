"""What the console's pages show, read in-process through the control plane's own
repositories and services (no HTTP round trip to the API)."""
