"""The `hx` command line: one module per command group, the root in `hx.cli.main`."""
