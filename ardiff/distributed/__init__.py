"""torch.distributed below the engine: who is who, process groups, what a pipeline sees.

    topology.py   ranks, replicas, CFG groups, devices, threads, budget shares
    context.py    what a pipeline sees of CFG-parallel (its branch, an all-gather) and the
                  upstream-style branch specs for a CFG world size
    env.py        the one place that reads torchrun's RANK / WORLD_SIZE / ... (launcher=env)
    group.py      the torch.distributed groups of a rank: init, agreement, teardown

Jobs that spawn and supervise the ranks are `ardiff.launch`'s, a layer above.
"""
