"""`ardiff bench --batch`'s table (cli/_bench_table.py): measurements under a header for every
column, the machine in the title, within 100 columns even at B=1,2,4,8 (#35, #33)."""

from __future__ import annotations

import io

from rich.console import Console

from ardiff_cli import _bench_table as bench_table

MACHINE = {"cpu_model": "Example CPU @ 2.10GHz", "cpu_capability": "AVX2", "cpus": 2,
           "torch_threads": 1, "load_before": [1.5, 1.2, 1.0], "load_after": [1.6, 1.3, 1.0]}


def spread(median: float) -> dict:
    return {"median": median, "p10": median * 0.9, "p90": median * 1.1, "n": 8}


def size(b: int) -> dict:
    return {"batch": b, "forwards": {str(b): 8}, "block_wall_s": spread(0.0123 * b),
            "frames_per_s": spread(81.3 * b ** 0.5),
            "speedup": {"wall": spread(b ** 0.5), "cpu": spread(b ** 0.6)},
            "max_abs_frame_diff": 0, "rows_checked": b, "pages_in_use_max": 12 * b,
            "pages_total": 96}


DATA = {"mode": "batch", "blocks": 8, "repeats": 3, "pipeline": "x:Y", "batched": True,
        "notice": None, "machine": MACHINE, "sizes": [size(b) for b in (1, 2, 4, 8)]}


def test_the_batch_table_fits_100_columns_with_a_header_on_every_column(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("rich.console.Console", lambda: Console(file=out, width=200))
    bench_table.print_bench(DATA, "configs/default.yaml")
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= bench_table.MAX_WIDTH
    for header in ("B", "forwards", "latency", "frames/s", "speedup wall", "speedup CPU",
                   "|diff| vs B=1", "KV pages"):
        assert header in text
    assert "Example CPU @ 2.10GHz (torch CPU capability AVX2)" in " ".join(text.split())
    assert "target" not in text and "MISSED" not in text
    rows = [line for line in text.splitlines() if line.startswith("│ 8 ")]
    assert len(rows) == 1  # one line per batch size, not wrapped over three


def test_markdown_keeps_the_spreads():
    text = bench_table.markdown(DATA, "default")
    assert "| 12.3 ms (11.1 ms - 13.5 ms) |" in text
    assert text.splitlines()[2].startswith("| B | forwards |")
