"""Side-by-side measurements behind `ardiff bench` (see run.py for how the arms alternate).

    spread.py      median and p10-p90; paired per-block ratios
    arms.py        the arms: an ardiff runner, or a hand-written loop
    references.py  which hand-written loop a pipeline is measured against
    encode.py      the encoder's CPU beside the model thread's
    report.py      BenchReport and its JSON
    run.py         run_bench: build the arms, warm up, alternate, sweep
    batch.py       run_batch_bench: B sessions per forward for each B (`bench --batch`)

Targets are printed by the CLI beside the numbers, never asserted.
"""

from ardiff.bench.report import BenchReport
from ardiff.bench.run import current_rss_bytes, run_bench

__all__ = ["BenchReport", "current_rss_bytes", "run_bench"]
