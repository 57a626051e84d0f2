"""The console's routes, one module per page family; all use `ConsoleRoute`."""
