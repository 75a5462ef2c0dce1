"""Packages are found, not listed: every folder under ardiff/ ships (a forgotten one cannot
drop out of the wheel). cli/ installs as `ardiff_cli`; configs/ as `ardiff.configs`.
The project's metadata is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["ardiff", "ardiff.*"], exclude=["*.__pycache__"]),
                "ardiff_cli", "ardiff.configs"])
