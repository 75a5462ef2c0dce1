"""Run configs shipped with ardiff (installed as the `ardiff.configs` package data)."""
