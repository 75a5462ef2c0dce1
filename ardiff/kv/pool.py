"""The page pool: the only owner of page ids. Pure integers, no tensors.

Building a pool costs nothing, whatever its size: ids are handed out low first from a
counter, and only ids that came back are kept, in one compact array (a stack: the last
freed is the first reused). No Python object is made per page.

    ids:   0 .. 1 .. 2 .. ... .. _next_fresh-1 | _next_fresh .. num_pages-1
           handed out once (used, or freed back  | never handed out: free
           onto _returned)                       |
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from ardiff.errors import KVStateError


class PagePool:
    """Hands out and takes back page ids `0..num_pages-1`.

    Invariants: every id is either free or used, never both; `num_free +
    num_used == num_pages`. `allocate` is all-or-nothing: on shortfall it
    returns None and changes nothing. Double free and foreign ids raise.
    Ids come out lowest first, and freed ids are reused last-freed first.
    Bookkeeping is O(1) Python objects: an array of returned ids and one byte
    per id ever handed out.
    """

    def __init__(self, num_pages: int) -> None:
        assert num_pages >= 0
        self.num_pages = num_pages
        self._next_fresh = 0               # ids >= this were never handed out
        self._returned = array("q")        # freed ids, reused from the end
        self._is_used = bytearray()        # per id < _next_fresh: 1 while handed out
        self.peak_used = 0

    @property
    def num_free(self) -> int:
        return self.num_pages - self._next_fresh + len(self._returned)

    @property
    def num_used(self) -> int:
        return self.num_pages - self.num_free

    def can_allocate(self, num: int) -> bool:
        return 0 <= num <= self.num_free

    def is_used(self, page_id: int) -> bool:
        """Whether `page_id` is handed out now."""
        return 0 <= page_id < self._next_fresh and bool(self._is_used[page_id])

    def allocate(self, num: int) -> list[int] | None:
        """`num` page ids, or None (and no change) if fewer are free."""
        if not self.can_allocate(num):
            return None
        returned, is_used = self._returned, self._is_used
        keep = len(returned) - min(num, len(returned))
        page_ids = returned[keep:].tolist()[::-1]
        del returned[keep:]
        for page_id in page_ids:
            is_used[page_id] = 1
        fresh = num - len(page_ids)
        if fresh:
            page_ids += range(self._next_fresh, self._next_fresh + fresh)
            self._next_fresh += fresh
            is_used.extend(b"\1" * fresh)
        self.peak_used = max(self.peak_used, self.num_used)
        return page_ids

    def free(self, page_ids: Iterable[int]) -> None:
        """Take pages back. Raises `KVStateError` on a foreign or already free id (no change)."""
        page_ids = list(page_ids)
        if len(set(page_ids)) != len(page_ids):
            raise KVStateError(f"page pool: ids {page_ids} repeat; a page is freed once")
        is_used, num_pages, next_fresh = self._is_used, self.num_pages, self._next_fresh
        for page_id in page_ids:
            if not (isinstance(page_id, int) and 0 <= page_id < num_pages):
                raise KVStateError(f"page pool: id {page_id!r} is not a page of this pool "
                                   f"(0..{num_pages - 1})")
            if page_id >= next_fresh or not is_used[page_id]:
                raise KVStateError(f"page pool: page {page_id} is already free (double free)")
        for page_id in page_ids:
            is_used[page_id] = 0
        self._returned.extend(page_ids)
