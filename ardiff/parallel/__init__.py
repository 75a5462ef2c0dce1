"""Beyond one process: data-parallel rollouts and CFG-parallel on torch.distributed.

    topology.py   who is who: ranks, replicas, CFG groups, devices, threads, budget shares
    context.py    what a pipeline sees of CFG-parallel (its branch, an all-gather) and the
                  upstream-style branch specs for a CFG world size
    env.py        the one place that reads torchrun's RANK / WORLD_SIZE / ... (launcher=env)
    group.py      the torch.distributed groups of a rank: init, agreement, teardown
    stop.py       a stop that the ranks of a CFG group agree on (lockstep)
    worker.py     one rank: set up, run its share of the job, report to the parent
    launch.py     the parent: check, spawn, supervise, merge (`run_parallel_rollout`)
    merge.py      the ranks' reports -> one job report with `parallel` and `ranks[]`
    speedup.py    `ardiff bench --workers N`: the same job on 1 and on N workers

Processes are spawned by ardiff (multiprocessing, spawn) or by `torchrun`; they talk
through torch.distributed (gloo on the CPU, nccl on CUDA) and, with spawn, report to the
parent over one multiprocessing pipe each. Nothing here prints or reads argv.
"""
