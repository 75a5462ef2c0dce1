"""A job in one process or many: `run_job` chooses, the rest runs the many.

    report = run_job(config, on_event=callback, stop=RolloutStop())

    job.py        run_job: one process (`ardiff.rollout.run_rollout`) or a parallel job
    parent.py     the parent: check, spawn, supervise, merge (`run_parallel_rollout`)
    supervisor.py the parent's watch over its ranks: phases, progress, results, stops, ends
    worker.py     one rank: set up, run its share of the job, report to the parent
    torchrun.py   a rank started by torchrun (launcher: env)
    stop.py       a stop that the ranks of a CFG group agree on (lockstep)
    merge.py      the ranks' reports -> one job report with `parallel` and `ranks[]`

Process groups, topology and what a pipeline sees of CFG-parallel live below, in
`ardiff.distributed`. Nothing here prints or reads argv.
"""
