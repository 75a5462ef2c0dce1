"""A recache on the paged cache: committed frames re-run in one forward, kept ones rewritten.

    kept:      | sink 0 1 2 (pages a b c) |  ...evicted...  | 9 .. 14 (pages d .. i) |
    recache of frames 6 .. 14 (6 .. 8 evicted: context only):
      attend(layer): q of 6..14 -> [K/V of pages a b c | k/v of 6..14]  (no mask among them)
      holds:         k/v of 9..14 for every layer (outside the pool)
      commit:        copies them into pages d .. i; no page changes hands

An abort drops what it holds: the pages are as they were. The table, its version and the
pool never change, so every cached address stays valid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover - typing only: paged imports this module
    from ardiff.kv.paged import PagedBranch


class PagedRecache:
    """Frames [start_frame, start_frame + num_frames) of one branch, re-run (`BlockKV`)."""

    def __init__(self, branch: PagedBranch, start_frame: int, num_frames: int) -> None:
        cache, table = branch.cache, branch.table
        self.storage, self.attend_fn = cache.storage, cache.attend_fn
        self.start_frame = start_frame
        kept = list(zip(table.visible_frames, table.visible_pages))
        self.visible_frames = [frame for frame, _ in kept if frame < start_frame]
        self.history = self.storage.frames_address(
            [pages for frame, pages in kept if frame < start_frame])
        rewritten = [(frame, pages) for frame, pages in kept
                     if start_frame <= frame < start_frame + num_frames]
        self.target = self.storage.frames_address([pages for _, pages in rewritten])
        tpf = cache.spec.tokens_per_frame
        # rows of the rewritten frames among the block's own tokens, in kept order
        self.own_rows = torch.tensor([(frame - start_frame) * tpf + token
                                      for frame, _ in rewritten for token in range(tpf)],
                                     dtype=torch.long, device=cache.device)
        self.new_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               extra_k: torch.Tensor | None, extra_v: torch.Tensor | None,
               scale: float | None) -> torch.Tensor:
        self.new_kv[layer] = (k.index_select(0, self.own_rows),
                              v.index_select(0, self.own_rows))
        history_k, history_v = self.storage.read(layer, self.history)
        keys, values = [history_k, k], [history_v, v]
        if extra_k is not None:
            assert extra_v is not None, "TensorChecks.extra passes both or neither"
            keys.append(extra_k)
            values.append(extra_v)
        return self.attend_fn(q, torch.cat(keys), torch.cat(values), scale)

    def commit(self) -> None:
        """The rewritten frames' pages take the new K/V, layer by layer."""
        for layer, (k, v) in self.new_kv.items():
            self.storage.write(layer, self.target, k, v)
        self.new_kv.clear()

    def abort(self) -> None:
        self.new_kv.clear()
