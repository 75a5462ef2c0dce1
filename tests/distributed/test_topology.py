"""Who runs what in a parallel job, pure integers: ranks, streams, threads, budgets, devices,
backends, torchrun's variables (ardiff/distributed/topology.py, env.py)."""

from __future__ import annotations

import pytest

from ardiff.config.parallel import ParallelConfig
from ardiff.distributed.env import rank_from_env
from ardiff.distributed.topology import (
    RankInfo,
    check_devices,
    check_streams,
    local_ranks,
    pick_backend,
    rank_budget,
    rank_device,
    rank_threads,
    replica_streams,
)
from ardiff.errors import ConfigError
from ardiff.sizes import MemoryBudget

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


def test_replicas_take_every_workers_th_stream():
    assert [replica_streams(r, 2, 4) for r in range(2)] == [[0, 2], [1, 3]]
    assert [replica_streams(r, 3, 4) for r in range(3)] == [[0, 3], [1], [2]]


def test_ranks_of_two_workers_with_cfg_parallel():
    ranks = local_ranks(ParallelConfig(workers=2, cfg=2))
    assert [(r.rank, r.replica, r.cfg_rank, r.writes) for r in ranks] == [
        (0, 0, 0, True), (1, 0, 1, False), (2, 1, 0, True), (3, 1, 1, False)]
    assert ranks[3].cfg_group_ranks == [2, 3]
    assert ranks[3].streams(3) == [1]
    assert {r.local_world_size for r in ranks} == {4}


@pytest.mark.parametrize("threads, cores, ranks, expected", [
    ("auto", 2, 2, 1), ("auto", 2, 1, 2), ("auto", 16, 4, 4), ("auto", 3, 2, 1),
    ("auto", 1, 4, 1), (3, 2, 2, 3)])
def test_threads_default_to_cores_over_local_ranks(threads, cores, ranks, expected):
    assert rank_threads(threads, cores, ranks) == expected


def test_a_fraction_of_host_memory_is_split_between_its_ranks():
    assert rank_budget(MemoryBudget(fraction=0.8), "cpu", 2) == MemoryBudget(fraction=0.4)
    assert rank_budget(MemoryBudget(num_bytes=100), "cpu", 2) == MemoryBudget(num_bytes=100)
    assert rank_budget(MemoryBudget(fraction=0.8), "cuda:1", 2) == MemoryBudget(fraction=0.8)


def test_each_rank_gets_its_local_cuda_device():
    assert rank_device("cpu", 3) == "cpu"
    assert [rank_device("cuda", r) for r in range(2)] == ["cuda:0", "cuda:1"]


def test_the_backend_follows_the_device():
    assert pick_backend("auto", "cpu") == "gloo"
    assert pick_backend("auto", "cuda") == "nccl"
    with pytest.raises(ConfigError, match=r"^runtime\.parallel\.backend: 'nccl' needs CUDA "
                                          r"devices, but runtime\.device is cpu; use auto or "
                                          r"gloo$"):
        pick_backend("nccl", "cpu")


def test_too_few_devices_is_a_usage_error():
    check_devices("cpu", 8, 0)
    check_devices("cuda", 2, 2)
    with pytest.raises(ConfigError) as error:
        check_devices("cuda", 4, 2)
    assert str(error.value) == ("runtime.parallel: 4 ranks on this host need 4 CUDA devices "
                                "(one per rank), but it has 2; lower runtime.parallel.workers "
                                "or cfg, or use --device cpu")
    assert error.value.exit_code == 2


def test_more_workers_than_prompts_is_refused():
    check_streams(2, 2)
    with pytest.raises(ConfigError, match=r"3 replicas for 2 prompt\(s\) would leave 1 idle"):
        check_streams(3, 2)


def test_torchrun_variables_give_the_rank():
    rank = rank_from_env(ParallelConfig(cfg=2), TORCHRUN)
    assert rank == RankInfo(rank=3, workers=2, cfg=2, local_rank=1, local_world_size=2)
    assert (rank.replica, rank.cfg_rank) == (1, 1)


def test_missing_torchrun_variables_name_them():
    with pytest.raises(ConfigError) as error:
        rank_from_env(ParallelConfig(launcher="env"), {"RANK": "0", "WORLD_SIZE": "2"})
    assert str(error.value) == (
        "runtime.parallel.launcher: env needs the variables torchrun sets (missing: "
        "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); start ardiff with torchrun, "
        "or use launcher: spawn")


def test_a_world_that_is_not_workers_times_cfg_is_refused():
    with pytest.raises(ConfigError, match=r"torchrun started 4 ranks, which is not workers "
                                          r"\(3\) x cfg \(1\)"):
        rank_from_env(ParallelConfig(workers=3), TORCHRUN)
    with pytest.raises(ConfigError, match=r"RANK='x' is not a rank count or index"):
        rank_from_env(ParallelConfig(), {**TORCHRUN, "RANK": "x"})
