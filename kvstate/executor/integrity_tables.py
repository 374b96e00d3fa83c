"""The integrity monitor's bookkeeping: expected contents, readers of pages, changes since a check.

``Tables`` is the base of :class:`~kvstate.executor.integrity.IntegrityMonitor`
and owns plain dicts and lists only (no torch, no state).  It records what
the monitor believes independently of the core state:

    req_content[r][p]    the Content request r's position p must read
    req_pages[r][i]      the page r's table index i maps (0: unmapped or null)
    req_dangling[r]      table indices ``FreeMapped`` left dangling (not read, not readers)
    node_content[n][t]   the Content tree node n's token t must read (radix mode)
    node_pages[n]        the device pages of radix node n (absent while host-only)
    tree_page[page]      (node, index in node) of a radix tree page
    cached[page]         (node, depth) of a block-mode cached copy
    slot_content[s]      what slot s's bytes are (absent: garbage, never written or freed)
    readers[page]        {request: table index} of every live entry that maps the page

and what changed since the last check: ``moved`` (slots whose bytes the
executor moved: copied or loaded into, freed and maybe poisoned), ``freed``,
``fresh_pages`` (pages the monitor itself wrote tags to), ``check_pages``
(pages whose readers changed: new cached copies), ``dirty_host`` (new host
copies) and ``touched`` (requests whose table changed).  ``readers`` is what
lets an incremental check find every reader of a slot whose bytes changed,
so aliasing is caught at once.

Why no other reads are needed: an expectation is only ever set to what the
monitor knows its slot holds (a fresh write, a link to the tree or slot
content, a copy), and that knowledge is checked against the bytes whenever
the executor moves them; so what can go wrong between two checks is a byte
move, a write onto a page someone else reads, or a table the rules built
differently from the plans, and each of those is in the dirty sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.executor.integrity_tags import Content
from kvstate.state import RequestId

TokenRef = tuple[RequestId, int, int]
_NOBODY = object()  # no request id equals it


class Tables:
    """Expected contents, page readers and dirty sets (mutable, owned by one monitor)."""

    def __init__(self, page_size: int, block: bool) -> None:
        self.size = page_size
        self.block = block
        self.uid_of: dict[RequestId, int] = {}
        self.req_content: dict[RequestId, list[Content]] = {}
        self.req_pages: dict[RequestId, list[int]] = {}
        self.req_dangling: dict[RequestId, set[int]] = {}
        self.node_content: dict[int, list[Content]] = {}
        self.node_pages: dict[int, tuple[int, ...]] = {}
        self.tree_page: dict[int, tuple[int, int]] = {}
        self.cached: dict[int, tuple[int, int]] = {}
        self.slot_content: dict[int, Content] = {}
        self.readers: dict[int, dict[RequestId, int]] = {}
        self.errors: list[str] = []
        self.clear_dirty()

    def clear_dirty(self) -> None:
        """Forget the changes (after a check read them)."""
        self.moved: set[int] = set()
        self.freed: set[int] = set()
        self.fresh_pages: set[int] = set()
        self.check_pages: set[int] = set()
        self.dirty_host: set[int] = set()
        self.touched: set[RequestId] = set()

    @property
    def dirty(self) -> bool:
        """Whether anything changed since the last check."""
        return bool(self.moved or self.fresh_pages or self.touched or self.check_pages
                    or self.dirty_host)

    # -- request tables ----------------------------------------------------------------
    def open(self, request_id: RequestId) -> None:
        self.req_content[request_id] = []
        self.req_pages[request_id] = []
        self.req_dangling[request_id] = set()
        self.touched.add(request_id)

    def close(self, request_id: RequestId) -> None:
        pages = self.req_pages.pop(request_id, [])
        dangling = self.req_dangling.pop(request_id, set())
        readers = self.readers
        for index, page in enumerate(pages):
            mapped = readers.get(page)
            if mapped is not None and mapped.get(request_id) == index and index not in dangling:
                del mapped[request_id]
                if not mapped:
                    del readers[page]
        self.req_content.pop(request_id, None)
        self.touched.add(request_id)

    def truncate(self, request_id: RequestId, length: int) -> None:
        keep = -(-length // self.size)
        pages, dangling = self.req_pages[request_id], self.req_dangling[request_id]
        for index in range(keep, len(pages)):
            if pages[index] and index not in dangling:
                self._unclaim(request_id, index, pages[index])
        del pages[keep:]
        del self.req_content[request_id][length:]
        self.req_dangling[request_id] = {i for i in dangling if i < keep}
        self.touched.add(request_id)

    def map_tokens(self, tokens: Sequence[TokenRef], contents: Sequence[Content]) -> None:
        """Positions of ``tokens`` now map their slot and must read ``contents`` (pairwise)."""
        size = self.size
        req_content, req_pages, req_dangling, readers = (self.req_content, self.req_pages,
                                                         self.req_dangling, self.readers)
        touched = self.touched
        current: Any = _NOBODY
        row: list[Content] = []
        pages: list[int] = []
        dangling: set[int] = set()
        for (request_id, position, slot), content in zip(tokens, contents, strict=True):
            if request_id != current:  # tokens come grouped by request
                current = request_id
                row, pages = req_content[request_id], req_pages[request_id]
                dangling = req_dangling[request_id]
                touched.add(request_id)
            if position == len(row):
                row.append(content)
            elif position < len(row):
                row[position] = content
            else:
                self.errors.append(f"request {request_id!r} got position {position} past its "
                                   f"{len(row)} known tokens")
                row.extend([(0, -1)] * (position - len(row)))
                row.append(content)
            index, page = position // size, slot // size
            if index < len(pages):
                if dangling and index in dangling:
                    dangling.discard(index)
                elif pages[index] == page:
                    continue
                elif pages[index]:
                    self._unclaim(request_id, index, pages[index])
                pages[index] = page
            else:
                if index > len(pages):
                    pages.extend([0] * (index - len(pages)))
                pages.append(page)
            if page:
                mapped = readers.get(page)
                if mapped is None:
                    readers[page] = {request_id: index}
                else:
                    mapped[request_id] = index

    def dangle(self, tokens: Sequence[TokenRef]) -> None:
        """``tokens``' entries were freed under their rows: no longer readers, not read."""
        size = self.size
        for request_id, position, slot in tokens:
            index = position // size
            dangling = self.req_dangling[request_id]
            if index not in dangling:
                dangling.add(index)
                self._unclaim(request_id, index, slot // size)

    def _claim(self, request_id: RequestId, index: int, page: int) -> None:
        readers = self.readers.get(page)
        if readers is None:
            self.readers[page] = {request_id: index}
        else:
            readers[request_id] = index

    def _unclaim(self, request_id: RequestId, index: int, page: int) -> None:
        readers = self.readers.get(page)
        if readers is not None and readers.get(request_id) == index:
            del readers[request_id]
            if not readers:
                del self.readers[page]

    # -- slots -------------------------------------------------------------------------------
    def free_slots(self, slots: Sequence[int]) -> None:
        slot_content = self.slot_content
        for slot in slots:
            slot_content.pop(slot, None)
        self.freed.update(slots)
        self.moved.update(slots)

    def overwritten(self, slots: Sequence[int]) -> None:
        """The executor moved bytes onto ``slots`` (a copy, a load): they must be read back."""
        self.moved.update(slots)

    def wrote(self, slots: Sequence[int]) -> None:
        """The monitor wrote tags at ``slots`` (``slot_content`` says which; not re-read)."""
        size = self.size
        self.fresh_pages.update([slot // size for slot in slots] if size > 1 else slots)

    def linked_content(self, slot: int) -> Content | None:
        """What a reader linking ``slot`` reads: the tree token there, else the slot's content."""
        entry = self.tree_page.get(slot // self.size)
        if entry is not None:
            tokens = self.node_content.get(entry[0])
            if tokens is not None:
                return tokens[entry[1] * self.size + slot % self.size]
        return self.slot_content.get(slot)

    # -- tree ----------------------------------------------------------------------------------
    def add_node(self, node_id: int, slots: Sequence[int], contents: list[Content]) -> None:
        self.node_content[node_id] = contents
        self.place_node(node_id, slots)

    def place_node(self, node_id: int, slots: Sequence[int]) -> None:
        """Node ``node_id``'s tokens now live at device ``slots`` (an insert or a load)."""
        pages = tuple(slot // self.size for slot in slots[::self.size])
        self.node_pages[node_id] = pages
        for index, page in enumerate(pages):
            self.tree_page[page] = (node_id, index)

    def split_node(self, node_id: int, at: int, new_node: int) -> None:
        tokens = self.node_content.pop(node_id)
        self.node_content[new_node] = tokens[:at]
        self.node_content[node_id] = tokens[at:]
        pages = self.node_pages.pop(node_id, None)
        if pages is None:
            return
        cut = at // self.size
        self.node_pages[new_node], self.node_pages[node_id] = pages[:cut], pages[cut:]
        for index, page in enumerate(pages):
            self.tree_page[page] = (new_node, index) if index < cut else (node_id, index - cut)

    def demote_node(self, node_id: int) -> None:
        """The node's device copy left the tree; its tag record stays (host-only)."""
        for page in self.node_pages.pop(node_id, ()):
            if self.tree_page.get(page, (None,))[0] == node_id:
                del self.tree_page[page]

    def drop_node(self, node_id: int) -> None:
        self.demote_node(node_id)
        self.node_content.pop(node_id, None)

    def tables_of(self, request_id: RequestId) -> tuple[list[Content], list[int], set[int]] | None:
        """``(contents, pages, dangling)`` of an open request, or None."""
        content = self.req_content.get(request_id)
        if content is None:
            return None
        return content, self.req_pages[request_id], self.req_dangling[request_id]

    def describe(self) -> dict[str, Any]:
        """Sizes of the bookkeeping (for debugging and benchmarks)."""
        return {"requests": len(self.req_content), "nodes": len(self.node_content),
                "slots": len(self.slot_content), "pages_read": len(self.readers)}
