"""What `ardiff bench --workers N` reports (ardiff/bench/speedup.py), from hand-made
timings: the runs themselves are measured by the benchmark, never in a test."""

from __future__ import annotations

import pytest

from ardiff.bench.speedup import TARGET_WALL_RATIO, Arm, SpeedupReport


def test_the_speedup_is_the_ratio_of_median_wall_times():
    one = Arm(1, wall_s=[10.0, 12.0, 11.0], rollout_s=[8.0, 9.0, 10.0], frames=192)
    two = Arm(2, wall_s=[6.0, 5.0, 7.0], rollout_s=[4.0, 4.5, 5.0], frames=192)
    data = SpeedupReport(one, two, True, (1.0, 0.5, 0.25)).to_dict()
    assert data["speedup"] == pytest.approx(11.0 / 6.0)
    assert data["rollout_speedup"] == pytest.approx(9.0 / 4.5)
    assert data["wall_ratio"] == pytest.approx(6.0 / 11.0)
    assert (data["ideal"], data["target_wall_ratio"]) == (2.0, TARGET_WALL_RATIO)
    assert data["workers"]["wall_s_median"] == 6.0 and data["one_worker"]["frames"] == 192
    assert data["frames_identical"] is True and data["load_average"] == [1.0, 0.5, 0.25]
