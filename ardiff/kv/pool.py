"""The page pool: the only owner of page ids. Pure integers, no tensors."""

from __future__ import annotations

from collections.abc import Iterable

from ardiff.errors import KVStateError


class PagePool:
    """Hands out and takes back page ids `0..num_pages-1`.

    Invariants: every id is either free or used, never both; `num_free +
    num_used == num_pages`. `allocate` is all-or-nothing: on shortfall it
    returns None and changes nothing. Double free and foreign ids raise.
    """

    def __init__(self, num_pages: int) -> None:
        assert num_pages >= 0
        self.num_pages = num_pages
        # Pop from the end: low ids are handed out first, which keeps tests readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_used = bytearray(num_pages)
        self.peak_used = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def can_allocate(self, num: int) -> bool:
        return 0 <= num <= len(self._free)

    def allocate(self, num: int) -> list[int] | None:
        """`num` page ids, or None (and no change) if fewer are free."""
        if not self.can_allocate(num):
            return None
        page_ids = [self._free.pop() for _ in range(num)]
        for page_id in page_ids:
            self._is_used[page_id] = 1
        self.peak_used = max(self.peak_used, self.num_used)
        return page_ids

    def free(self, page_ids: Iterable[int]) -> None:
        """Take pages back. Raises `KVStateError` on a foreign or already free id (no change)."""
        page_ids = list(page_ids)
        if len(set(page_ids)) != len(page_ids):
            raise KVStateError(f"page pool: ids {page_ids} repeat; a page is freed once")
        for page_id in page_ids:
            if not (isinstance(page_id, int) and 0 <= page_id < self.num_pages):
                raise KVStateError(f"page pool: id {page_id!r} is not a page of this pool "
                                   f"(0..{self.num_pages - 1})")
            if not self._is_used[page_id]:
                raise KVStateError(f"page pool: page {page_id} is already free (double free)")
        for page_id in page_ids:
            self._is_used[page_id] = 0
            self._free.append(page_id)
