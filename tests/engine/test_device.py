"""ardiff/engine/device.py: the free memory a fraction budget is taken of, and a byte budget is
checked against, is what this process may really use (a container's limit included)."""

from __future__ import annotations

import pytest

from ardiff.engine import device

GiB = 2**30


def cgroup(folder, files: dict[str, str]):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return str(folder)


@pytest.fixture
def host_with(monkeypatch):
    """`host_with(available, *folders)`: MemAvailable and the cgroup folders this process is in."""
    def make(available: int, *folders: str) -> None:
        monkeypatch.setattr(device, "_meminfo_available", lambda: available)
        monkeypatch.setattr(device, "_cgroup_folders", lambda: list(folders))
    return make


def test_a_cgroup_v2_limit_below_the_hosts_memory_wins(tmp_path, host_with):
    host_with(64 * GiB, cgroup(tmp_path / "v2", {
        "memory.max": f"{8 * GiB}\n", "memory.current": f"{3 * GiB}\n",
        "memory.stat": f"anon 1\ninactive_file {GiB}\nactive_file 5\n"}))
    assert device.free_memory_bytes("cpu") == 6 * GiB  # 8 - 3 + 1 reclaimable


def test_a_cgroup_v1_limit(tmp_path, host_with):
    host_with(64 * GiB, cgroup(tmp_path / "v1", {
        "memory.limit_in_bytes": f"{4 * GiB}\n", "memory.usage_in_bytes": f"{GiB}\n",
        "memory.stat": "total_inactive_file 0\n"}))
    assert device.free_memory_bytes("cpu") == 3 * GiB


def test_no_limit_means_the_hosts_available_memory(tmp_path, host_with):
    host_with(64 * GiB,
              cgroup(tmp_path / "v2", {"memory.max": "max\n", "memory.current": "5\n"}),
              cgroup(tmp_path / "v1", {"memory.limit_in_bytes": "9223372036854771712\n",
                                       "memory.usage_in_bytes": "5\n"}),
              cgroup(tmp_path / "empty", {}))
    assert device.free_memory_bytes("cpu") == 64 * GiB


def test_the_host_wins_when_it_has_less(tmp_path, host_with):
    host_with(2 * GiB, cgroup(tmp_path / "v2", {"memory.max": f"{8 * GiB}",
                                                "memory.current": "0"}))
    assert device.free_memory_bytes("cpu") == 2 * GiB


def test_over_the_limit_is_zero_free(tmp_path, host_with):
    host_with(64 * GiB, cgroup(tmp_path / "v2", {"memory.max": f"{GiB}",
                                                 "memory.current": f"{2 * GiB}"}))
    assert device.free_memory_bytes("cpu") == 0


def test_this_machine_reports_some_free_memory():
    assert device.free_memory_bytes("cpu") > 0
