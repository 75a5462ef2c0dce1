"""ardiff/kv/backends.py: one table names the KV backends; everything that lists them reads it.

A dummy backend added as ONE table entry (in a fresh interpreter, before anything else is
imported) is accepted by the config, listed by both JSON schemas, built by create_cache,
run by the state-API tests' backend list and measured by the bench as its own arm."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ardiff.kv.backends import BACKENDS, DEFAULT_BACKEND, backend_names, reference_backend

DUMMY = textwrap.dedent("""
    import json
    from ardiff.kv.backends import BACKENDS, Backend
    # The one entry: a backend named "dummy" whose class is the dense cache under another name.
    BACKENDS["dummy"] = Backend("ardiff.kv.dense:DenseKVCache", "a test's backend")

    from ardiff.bench.report import RATIOS
    from ardiff.config.run import build_config, config_json_schema
    from ardiff.kv.backend import create_cache
    from ardiff.kv.plan import make_plan
    from ardiff.rollout.report import STATS_SCHEMA
    from kvdrive import make_spec

    config = build_config({"pipeline": {"entry": "x:y"}, "runtime": {"kv": {"backend": "dummy"}}})
    cache = create_cache(make_plan(make_spec(), "float32", 4, 1 << 24), "dummy")
    print(json.dumps({
        "config": config.runtime.kv.backend,
        "config_schema": config_json_schema()["$defs"]["KVConfig"]["properties"]["backend"]["enum"],
        "stats_schema": STATS_SCHEMA["properties"]["kv"]["properties"]["backend"]["enum"],
        "cache": type(cache).__name__,
        "ratios": [name for name, _, _ in RATIOS],
    }))
""")


def test_the_table_names_the_backends_and_their_roles():
    assert backend_names() == ("paged", "dense")
    assert DEFAULT_BACKEND == "paged" and reference_backend() == "dense"
    assert BACKENDS["paged"].cache_class().__name__ == "PagedKVCache"
    assert BACKENDS["dense"].cache_class().__name__ == "DenseKVCache"


def test_a_backend_added_in_one_table_entry_is_everywhere(tmp_path):
    import json
    from pathlib import Path

    support = Path(__file__).parents[1] / "support"
    done = subprocess.run([sys.executable, "-c", DUMMY], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(support), "PATH": "/usr/bin"},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["config"] == "dummy"
    assert seen["config_schema"] == ["paged", "dense", "dummy"]
    assert seen["stats_schema"] == ["paged", "dense", "dummy"]
    assert seen["cache"] == "DenseKVCache"
    assert "dummy/dense" in seen["ratios"] and "paged/dense" in seen["ratios"]


def test_an_unknown_backend_is_refused_with_the_table_names():
    import pytest
    from kvdrive import make_spec

    from ardiff.errors import KVStateError
    from ardiff.kv.backend import create_cache
    from ardiff.kv.plan import make_plan

    with pytest.raises(KVStateError, match="'flash' is not a backend; use paged or dense"):
        create_cache(make_plan(make_spec(), "float32", 4, 1 << 24), "flash")
