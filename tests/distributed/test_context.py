"""CFG-parallel as a pipeline sees it (ardiff/distributed/context.py), the config knobs, the
lockstep stop and how the parent merges the ranks' outcomes (merge.py)."""

from __future__ import annotations

import pytest

from ardiff.config.run import build_config
from ardiff.distributed.context import ParallelContext, bind_parallel, cfg_branch_specs
from ardiff.errors import ConfigError, RunError
from ardiff.launch.merge import Failure, JobOutcome
from ardiff.launch.stop import RankStop
from ardiff.pipelines.tiny_dit import TinyCausalDiT
from ardiff.rollout.stop import RolloutStop


def test_branch_specs_share_slot_0_when_each_rank_runs_one():
    assert [(b.name, b.local_index) for b in cfg_branch_specs(1)] == [
        ("positive", 0), ("negative", 1)]
    assert [(b.name, b.local_index) for b in cfg_branch_specs(2)] == [
        ("positive", 0), ("negative", 0)]
    with pytest.raises(ConfigError, match=r"runtime\.parallel\.cfg: 3 is invalid"):
        cfg_branch_specs(3)


def test_the_tiny_dit_declares_one_slot_per_rank_under_cfg_parallel():
    pipeline = TinyCausalDiT(cfg=True)
    assert pipeline.ar_diffusion_kv_cache_spec().num_local_kv_branches == 2
    bind_parallel(pipeline, 2, ParallelContext(rank=1, world_size=2))
    spec = pipeline.ar_diffusion_kv_cache_spec()
    assert spec.num_local_kv_branches == 1 and len(spec.kv_branches) == 2
    assert pipeline.parallel.branch == "negative"


def test_a_dry_context_cannot_gather():
    with pytest.raises(RunError, match="no process group"):
        ParallelContext(0, 2).all_gather(object())


@pytest.mark.parametrize("override, message", [
    ("runtime.parallel.threads=0", "runtime.parallel.threads: 0 is invalid; give a number of "
     "threads from 1 to 1024, or auto (the host's cores / its ranks)"),
    ("runtime.parallel.workers=0", "runtime.parallel.workers: 0 is invalid; it must be > 0"),
    ("runtime.parallel.launcher=ray", "runtime.parallel.launcher: 'ray' (str) is not allowed; "
     "use one of 'spawn', 'env'"),
    ("runtime.parallel.timeout_s=0.0", "runtime.parallel.timeout_s: 0.0 is invalid; it must "
     "be > 0.0"),
])
def test_parallel_knobs_are_checked(override, message):
    with pytest.raises(ConfigError) as error:
        build_config({"pipeline": {"entry": "x:y"}}, [override])
    assert str(error.value) == message


def test_a_rank_stop_follows_the_callers_stop():
    outer = RolloutStop()
    stop = RankStop(follow=outer)
    assert stop.poll() is None
    outer.request("SIGTERM")
    assert stop.poll() == "SIGTERM"


def test_the_cause_of_a_failed_job_is_not_a_peers_reaction():
    outcome = JobOutcome(failures=[Failure(0, "peer left", peer_lost=True),
                                   Failure(1, "RankFault: injected")])
    assert outcome.cause.rank == 1
    assert JobOutcome(failures=[Failure(0, "peer left", peer_lost=True)]).cause.rank == 0
    assert JobOutcome().cause is None


def test_a_single_process_command_refuses_cfg_parallel():
    from ardiff.engine.build import build_runner

    config = build_config({"pipeline": {"entry": "ardiff.pipelines.tiny_dit:TinyCausalDiT",
                                        "args": {"cfg": True}},
                           "runtime": {"memory_budget": "32MiB", "parallel": {"cfg": 2}},
                           "rollout": {"guidance_scale": 3.0}})
    with pytest.raises(ConfigError, match=r"^runtime\.parallel\.cfg: 2 runs one CFG branch per "
                                          r"rank, and this command runs one process; use "
                                          r"`ardiff rollout`"):
        build_runner(config)


class FakeGroups:
    """Stands in for ardiff.distributed.group.Groups: the CFG peer's vote is given."""

    cfg = "cfg-group"

    def __init__(self, peer_wants_to_stop: bool) -> None:
        self.peer, self.calls = int(peer_wants_to_stop), []

    def reduce(self, value: int, op: str, group: object) -> int:
        self.calls.append((value, op, group))
        return max(value, self.peer)


def test_the_ranks_of_a_cfg_group_agree_to_stop_at_the_same_block():
    quiet, wanting = RankStop(), RankStop()
    quiet.groups, wanting.groups = FakeGroups(True), FakeGroups(False)
    wanting.request("SIGINT")
    assert quiet.poll() == "a stop of its CFG peer"   # its peer asked: it stops too
    assert wanting.poll() == "SIGINT"
    assert quiet.groups.calls == [(0, "MAX", "cfg-group")]
    alone = RankStop()
    alone.groups = FakeGroups(False)
    assert alone.poll() is None
