"""`ardiff config-schema`: the JSON Schema of run configs, so editors check and complete them."""

from __future__ import annotations

import json


def config_schema_command() -> None:
    """Print the JSON Schema of run config files (save it and point your editor at it)."""
    from ardiff.config.run import config_json_schema  # pydantic: only when the command runs

    print(json.dumps(config_json_schema(), indent=2))
