"""The batched attend, measured: B sessions' probe blocks attended three ways over one paged
cache. One process, one torch thread; the arms alternate pair by pair (which goes first
alternates too), so machine load hits all alike; times are the thread's CPU time (a busy
machine slows the wall clock, not these). Prints per-block medians and the paired ratios
to `rows` (median, p10-p90).

    python benchmarks/kv_batch.py default|tiny|wan [--rows 1,2,4,8] [--pairs N]
                                  [--histories lockstep,ragged]

    rows      today's single attend, one session after another (B `state.block`s)
    stacked   `KVStateBatch.block(...).attend`: rows of equal key count in one SDPA call,
              the others one by one (what ardiff runs, ardiff/kv/backend.py attend_rows)
    padded    the alternative: every row padded to the longest history, one masked SDPA

`lockstep`: every session's window is full (equal histories); `ragged`: session r holds
r/(B-1) of a full window. `wan` is configs/bench-wide.yaml (Wan2.1-1.3B-shaped layers, fp32)
with 16 query tokens per block, as benchmarks/kv_paired.py runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ardiff.config.run import load_config
from ardiff.dtypes import DTYPE_BYTES
from ardiff.engine.build import resolve
from ardiff.kv import batch as batch_module
from ardiff.kv.backend import create_cache
from ardiff.kv.batch import KVStateBatch
from ardiff.kv.plan import make_plan
from ardiff.kv.state import open_state

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"default": None, "tiny": ROOT / "configs/tiny-dit.yaml",
           "wan": ROOT / "configs/bench-wide.yaml"}
WAN_Q_TOKENS = 16
BUDGET_BYTES = 1 << 40  # the plan then holds exactly the B sessions asked for
ARMS = ("rows", "stacked", "padded")


def _spec(name: str, num_rows: int):
    """The config's effective spec, holding `num_rows` sessions (its own cap may be lower)."""
    spec = resolve(load_config(CONFIGS[name], ["runtime.max_sessions=1"])).spec
    return dataclasses.replace(spec, session_capacity=max(num_rows, spec.session_capacity))


def _padded_attend_rows(cache, rows, layer, q, k, v, extra_k, extra_v, scale):
    """Every row's [history | k | extra] padded to the longest, one SDPA with a key mask."""
    keys, values = zip(*(kv.keys_values(layer, k[i], v[i]) for i, kv in enumerate(rows)))
    if extra_k is not None:
        keys = [[*row, extra_k[i]] for i, row in enumerate(keys)]
        values = [[*row, extra_v[i]] for i, row in enumerate(values)]
    counts = [sum(t.shape[0] for t in row) for row in keys]
    longest = max(counts)
    shape = (len(rows), longest, *k.shape[2:])
    k_rows, v_rows = q.new_zeros(shape), q.new_zeros(shape)
    for i, count in enumerate(counts):
        torch.cat(keys[i], out=k_rows[i, :count])
        torch.cat(values[i], out=v_rows[i, :count])
    mask = None
    if min(counts) < longest:
        mask = (torch.arange(longest) < torch.tensor(counts)[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k_rows.transpose(1, 2),
                                         v_rows.transpose(1, 2), attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


class Setup:
    """B sessions on one paged cache planned as the eager runtime plans it, their histories
    filled; probe blocks change nothing, so every arm reads the same pages."""

    def __init__(self, name: str, num_rows: int, ragged: bool) -> None:
        self.spec = spec = _spec(name, num_rows)
        plan = make_plan(spec, "float32", DTYPE_BYTES["float32"], BUDGET_BYTES,
                         max_sessions=num_rows, stores_registers=False, batch_rows=num_rows)
        self.cache = create_cache(plan, "paged")
        self.sids = [f"s{row}" for row in range(num_rows)]
        self.gen = torch.Generator().manual_seed(0)
        full = -(-(spec.sink_frames + spec.window_frames) // spec.frames_per_block)
        for row, sid in enumerate(self.sids):
            blocks = full if not ragged else (row * full) // max(1, num_rows - 1)
            for _ in range(blocks):
                self._commit(sid)
        block_tokens = spec.frames_per_block * spec.tokens_per_frame
        q_tokens = WAN_Q_TOKENS if name == "wan" else block_tokens
        kv_shape = (num_rows, block_tokens, spec.num_kv_heads, spec.head_size)
        self.q = self._randn(num_rows, q_tokens, spec.num_kv_heads, spec.head_size)
        self.k, self.v = self._randn(*kv_shape), self._randn(*kv_shape)
        registers = spec.max_scratch_tokens_per_branch
        extra = (self._randn(num_rows, registers, spec.num_kv_heads, spec.head_size)
                 if registers else None)
        self.extra = (extra, extra)

    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def _commit(self, sid: str) -> None:
        s = self.spec
        tokens = s.frames_per_block * s.tokens_per_frame
        state = open_state(self.cache, sid)
        with state.block(s.kv_branches[0].name, commit=True) as blk:
            for layer in range(s.num_layers):
                kv = self._randn(tokens, s.num_kv_heads, s.head_size)
                blk.attend(layer, kv, kv, kv)
        state.close()

    def run(self, arm: str) -> None:
        """One probe block (every layer) of every session, by `arm`."""
        branch = self.spec.kv_branches[0].name
        if arm == "rows":
            for row, sid in enumerate(self.sids):
                state = open_state(self.cache, sid)
                extra = [None if t is None else t[row] for t in self.extra]
                with state.block(branch) as blk:
                    for layer in range(self.spec.num_layers):
                        blk.attend(layer, self.q[row], self.k[row], self.v[row], *extra)
                state.close()
            return
        states = KVStateBatch([open_state(self.cache, sid) for sid in self.sids])
        chosen = batch_module.attend_rows
        if arm == "padded":
            batch_module.attend_rows = _padded_attend_rows  # type: ignore[assignment]
        try:
            with states.block(branch) as blk:
                for layer in range(self.spec.num_layers):
                    blk.attend(layer, self.q, self.k, self.v, *self.extra)
        finally:
            batch_module.attend_rows = chosen
            for state in states:
                state.close()


def measure(name: str, num_rows: int, ragged: bool, pairs: int) -> dict:
    setup = Setup(name, num_rows, ragged)
    for arm in ARMS:  # warm every path once
        setup.run(arm)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}  # thread CPU: load-proof
    for i in range(pairs):
        for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
            start = time.thread_time()
            setup.run(arm)
            times[arm].append(time.thread_time() - start)
    result = {"ms": {arm: 1000 * statistics.median(t) for arm, t in times.items()}}
    for arm in ("stacked", "padded"):
        ratios = sorted(a / b for a, b in zip(times[arm], times["rows"]))
        deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
        result[arm] = (statistics.median(ratios), deciles[0], deciles[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", choices=sorted(CONFIGS))
    parser.add_argument("--rows", default="1,2,4,8", help="batch sizes B, comma-separated")
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--histories", default="lockstep,ragged", help="which to run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{args.config}: probe block of B sessions, thread CPU ms (median); ratio to rows: median "
          f"(p10-p90) over {args.pairs} alternating rounds; load {load}")
    for num_rows in (int(b) for b in args.rows.split(",")):
        kinds = args.histories.split(",") if num_rows > 1 else ["lockstep"]
        for ragged in (kind == "ragged" for kind in kinds):
            r = measure(args.config, num_rows, ragged, args.pairs)
            ms = "  ".join(f"{arm} {r['ms'][arm]:8.3f}" for arm in ARMS)
            ratios = "  ".join(f"{arm}/rows {r[arm][0]:.2f} ({r[arm][1]:.2f}-{r[arm][2]:.2f})"
                               for arm in ("stacked", "padded"))
            kind = "ragged" if ragged else "lockstep"
            print(f"  B={num_rows} {kind:8s}  {ms}   {ratios}", flush=True)


if __name__ == "__main__":
    main()
