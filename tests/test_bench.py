"""ardiff/bench.py as a library: what it opens it closes, whatever happens."""

from __future__ import annotations

from pathlib import Path

import pytest

from ardiff import bench
from ardiff.config.run import load_config

TINY_DIT = Path(__file__).resolve().parents[1] / "configs" / "tiny-dit.yaml"


class Boom(RuntimeError):
    pass


def test_run_bench_closes_its_runners_when_a_measurement_raises(monkeypatch):
    built = {}
    real_runners = bench._runners

    def keep(config):
        built.update(real_runners(config))
        return built

    def fail(*args, **kwargs):
        raise Boom("injected measurement fault")

    monkeypatch.setattr(bench, "_runners", keep)
    monkeypatch.setattr(bench, "_measure", fail)
    with pytest.raises(Boom):
        bench.run_bench(load_config(TINY_DIT), blocks=1, repeats=1, encode=False)
    assert set(built) == {"paged", "dense"}
    for runner in built.values():
        with pytest.raises(Exception, match="the runner is closed"):
            runner.warmup()


def test_current_rss_is_a_whole_number_of_pages():
    import os

    assert bench.current_rss_bytes() % os.sysconf("SC_PAGE_SIZE") == 0
    assert bench.current_rss_bytes() > 0
