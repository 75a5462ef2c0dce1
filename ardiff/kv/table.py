"""The page table of one branch of one session: committed frames -> page ids.

Pure integer bookkeeping. Positions are absolute frame indices (what RoPE
sees) however many frames were evicted; the table itself holds at most
`sink_frames + past_frames` frames, so it stays bounded for any rollout.
"""

from __future__ import annotations

from collections import deque

from ardiff.kv.window import WindowPolicy

FramePages = tuple[int, ...]  # the page ids of one frame, in token order


class PageTable:
    """Sink frames (never evicted) and recent frames (evicted by the window policy)."""

    def __init__(self, policy: WindowPolicy) -> None:
        self.policy = policy
        self.num_committed_frames = 0
        self.version = 0  # changes whenever the kept frames change (commit, release)
        self._sink: list[FramePages] = []               # frame i is _sink[i]
        self._recent: deque[tuple[int, FramePages]] = deque()  # (frame index, pages)

    @property
    def visible_frames(self) -> list[int]:
        """Absolute indices of the frames the next block attends to (all that is kept)."""
        return list(range(len(self._sink))) + [index for index, _ in self._recent]

    @property
    def visible_pages(self) -> list[FramePages]:
        """Page ids of the visible frames, in the order of `visible_frames`."""
        return self._sink + [pages for _, pages in self._recent]

    @property
    def num_frames(self) -> int:
        return len(self._sink) + len(self._recent)

    @property
    def num_pages(self) -> int:
        return sum(len(pages) for pages in self.visible_pages)

    def commit(self, frames: list[FramePages]) -> list[int]:
        """Append frames (their pages become history); return the page ids the window evicts."""
        for pages in frames:
            if self.policy.is_sink(self.num_committed_frames):
                self._sink.append(pages)
            else:
                self._recent.append((self.num_committed_frames, pages))
            self.num_committed_frames += 1
        self.version += 1
        keep = self.policy.num_recent_to_keep(len(self._recent))
        evicted: list[int] = []
        while len(self._recent) > keep:
            evicted.extend(self._recent.popleft()[1])
        return evicted

    def release(self) -> list[int]:
        """Forget everything; return every page id the table held."""
        page_ids = [page for pages in self.visible_pages for page in pages]
        self._sink.clear()
        self._recent.clear()
        self.num_committed_frames = 0
        self.version += 1
        return page_ids
