"""The `ardiff` command line (installed as the `ardiff_cli` package)."""
