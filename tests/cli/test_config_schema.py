"""`ardiff config-schema`: the JSON Schema editors check YAML run configs with.

It must accept the shipped configs and reject what `ardiff` rejects (unknown keys, a
value that is not one of the choices), so an editor marks a mistake where it is typed.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from ardiff.config.run import config_json_schema

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["configs/default.yaml", "configs/tiny-dit.yaml"]


@pytest.fixture(scope="module")
def schema() -> dict:
    return config_json_schema()


def read(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text(encoding="utf-8"))


def test_the_command_prints_the_schema_as_json(ardiff_main, schema):
    result = ardiff_main("config-schema")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == schema
    jsonschema.Draft7Validator.check_schema(schema)


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_configs_validate(schema, name):
    jsonschema.validate(read(name), schema)


@pytest.mark.parametrize("path, key", [
    ((), "video"),                   # an unknown section
    (("runtime", "kv"), "windw_frames"),
    (("rollout",), "frams"),
])
def test_an_unknown_key_is_rejected(schema, path, key):
    data = read("configs/default.yaml")
    section = data
    for name in path:
        section = section.setdefault(name, {})
    section[key] = 3
    with pytest.raises(jsonschema.ValidationError, match=f"'{key}' was unexpected"):
        jsonschema.validate(data, schema)


@pytest.mark.parametrize("section, values", [
    ("runtime", {"dtype": "fp32"}),
    ("runtime", {"device": "gpu"}),
    ("runtime", {"memory_budget": "12XB"}),
    ("rollout", {"frames": 0}),
    ("rollout", {"prompt": [{"frame": 0}]}),  # a schedule entry without its prompt
])
def test_bad_values_are_rejected(schema, section, values):
    data = read("configs/tiny-dit.yaml")
    data[section].update(values)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_sizes_and_schedules_validate(schema):
    data = read("configs/tiny-dit.yaml")
    data["runtime"].update(memory_budget="1.5 gib", kv={"window_frames": 6})
    data["rollout"]["prompt"] = [{"frame": 0, "prompt": "a"},
                                 {"frame": 12, "prompt": "b", "on_switch": "reset"}]
    jsonschema.validate(data, schema)
    data["runtime"]["memory_budget"] = 0.5
    jsonschema.validate(data, schema)
