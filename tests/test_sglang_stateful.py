"""Random admit / chunked extend / decode / finish / unfinished-cache / evict / retract sequences
over the kvstate.sglang objects, with page_size in {1, 2, 4} and a tiny vocabulary.

Requests finish either through ``cache_finished_req`` or through 0.5.23's
own order (``checkpoint``, ``free_kv_row`` of the tail the row still maps,
``unlock``, ``ReqToTokenPool.free``), and decode either one request at a
time or as one batched ``write((rows, positions), slots)``.  After every
step: ``kvstate.invariants.check`` is clean, ``req_to_token`` equals the
state, and SGLang's own accounting identity holds:
``available + evictable + protected + sum(uncached of running) == total``.
"""

import hypothesis.strategies as st
import torch
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from kvstate import check
from kvstate.sglang import Req
from tests.sglang_helpers import build

TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=10)


class SGLangMachine(RuleBasedStateMachine):
    running = Bundle("running")

    @initialize(page_size=st.sampled_from([1, 2, 4]), pages=st.integers(4, 12))
    def setup(self, page_size, pages):
        self.page_size = page_size
        self.total = pages * page_size
        self.pool, self.allocator, self.cache = build(
            num_tokens=self.total, page_size=page_size, rows=4, width=64)
        self.live: dict[str, Req] = {}
        self.counter = 0

    # -- helpers --------------------------------------------------------------
    def _alloc(self, req, start, stop):
        """Slots for positions [start, stop) of req's row, evicting the deficit first."""
        if stop <= start:
            return []
        row = req.req_pool_idx
        size = self.page_size
        if size == 1:
            need = stop - start
        else:
            need = (-(-stop // size) - -(-start // size)) * size
        if self.allocator.available_size() < need:
            self.cache.evict(need - self.allocator.available_size())
        if size == 1:
            out = self.allocator.alloc(stop - start)
        else:
            last = int(self.pool.req_to_token[row, start - 1]) if start else -1
            out = self.allocator.alloc_extend([start], [stop], [last])
        if out is None:
            return None
        self.pool.write((row, slice(start, stop)), out)
        return out.tolist()

    def _kv_len(self, req):
        return self.cache.state.requests[req.req_pool_idx].allocated

    def _release(self, req):
        """Retract: free what the request owns, the row, and the lock (SGLang's order)."""
        row = req.req_pool_idx
        protected = req.cache_protected_len
        allocated = self._kv_len(req)
        if allocated > protected:
            self.allocator.free(self.pool.req_to_token[row, protected:allocated])
        self.pool.free(row)
        self.cache.dec_lock_ref(req.last_node)
        req.req_pool_idx = None

    # -- rules --------------------------------------------------------------------
    @rule(target=running, prompt=TOKENS, chunk=st.integers(1, 8))
    def admit(self, prompt, chunk):
        if self.pool.available_size() == 0:
            return None
        req = Req(f"r{self.counter}", prompt)
        self.counter += 1
        hit, node = self.cache.match_prefix(prompt[:-1])
        req.prefix_indices, req.last_node = hit, node
        req.cache_protected_len = len(hit)
        self.cache.inc_lock_ref(node)
        req.req_pool_idx = self.pool.alloc(1)[0]
        if len(hit):
            self.pool.write((req.req_pool_idx, slice(0, len(hit))), hit)
        stop = min(len(prompt), len(hit) + chunk)  # chunked prefill: the first chunk only
        if self._alloc(req, len(hit), stop) is None:
            self._release(req)
            return None
        req.fill_ids = prompt[:stop]
        self.live[req.rid] = req
        return req.rid

    @rule(rid=running, chunk=st.integers(1, 8))
    def extend(self, rid, chunk):
        req = self.live.get(rid)
        if req is None:
            return
        done = self._kv_len(req)
        if done >= len(req.origin_input_ids) or req.output_ids:
            return
        self.cache.cache_unfinished_req(req)
        stop = min(len(req.origin_input_ids), done + chunk)
        if self._alloc(req, done, stop) is not None:
            req.fill_ids = req.origin_input_ids[:stop]

    @rule(rid=running, token=st.integers(1, 3))
    def decode(self, rid, token):
        req = self.live.get(rid)
        if req is None or self._kv_len(req) < len(req.origin_input_ids):
            return
        if not req.output_ids:
            req.output_ids.append(token)  # the prefill's sampled token has no KV yet
            return
        position = len(req.origin_input_ids) + len(req.output_ids) - 1
        if position + 1 >= 60 or self._alloc(req, position, position + 1) is None:
            return
        req.output_ids.append(token)

    @rule(token=st.integers(1, 3))
    def decode_batch(self, token):
        """One decode step for every request past its prefill: one batched row write."""
        batch = [r for r in self.live.values() if r.output_ids
                 and self._kv_len(r) == len(r.origin_input_ids) + len(r.output_ids) - 1
                 and self._kv_len(r) + 1 < 60]
        if not batch:
            return
        rows = torch.tensor([r.req_pool_idx for r in batch])
        seq = torch.tensor([self._kv_len(r) for r in batch])
        size = self.page_size
        need = len(batch) if size == 1 else size * sum(1 for n in seq.tolist() if n % size == 0)
        if self.allocator.available_size() < need:
            self.cache.evict(need - self.allocator.available_size())
        if size == 1:
            out = self.allocator.alloc(len(batch))
        else:
            out = self.allocator.alloc_decode(seq + 1, seq + 1, self.pool.req_to_token[rows, seq - 1])
        if out is None:
            return
        self.pool.write((rows, seq), out.to(torch.int32))
        for req in batch:
            req.output_ids.append(token)

    @rule(rid=running)
    def unfinished_cache(self, rid):
        req = self.live.get(rid)
        if req is not None:
            req.fill_ids = (req.origin_input_ids + req.output_ids)[: self._kv_len(req)]
            self.cache.cache_unfinished_req(req)

    @rule(rid=consumes(running))
    def finish(self, rid):
        req = self.live.pop(rid, None)
        if req is None:
            return
        expected_kv = len(req.origin_input_ids) + len(req.output_ids) - 1
        if not req.output_ids or self._kv_len(req) != expected_kv:
            self._release(req)  # not finishable yet: abort it instead
            return
        self.cache.cache_finished_req(req)

    @rule(rid=consumes(running))
    def finish_0523(self, rid):
        """SGLang 0.5.23's release: checkpoint, free the tail under the row, unlock, free the row."""
        req = self.live.pop(rid, None)
        if req is None:
            return
        owned = self._kv_len(req)
        self.cache.checkpoint(req, up_to=owned)
        self.cache.free_kv_row(req, [(req.cache_protected_len, owned)])
        self.cache.unlock(req.lock)
        self.pool.free(req)

    @rule(rid=consumes(running))
    def retract(self, rid):
        req = self.live.pop(rid, None)
        if req is not None:
            self._release(req)

    @rule(num_tokens=st.integers(1, 8))
    def evict(self, num_tokens):
        self.cache.evict(num_tokens)

    # -- checks ---------------------------------------------------------------
    @invariant()
    def core_invariants_hold(self):
        if hasattr(self, "cache"):
            assert check(self.cache.state) == []

    @invariant()
    def table_equals_state(self):
        if hasattr(self, "pool"):
            assert self.pool.verify() == []

    @invariant()
    def locks_match_running_requests(self):
        """Each node's lock_ref is the number of running requests whose locked path covers it."""
        if not hasattr(self, "cache"):
            return
        state = self.cache.state
        expected: dict[int, int] = {}
        for req in self.live.values():
            for node_id in state.path_to_root(req.last_node.id):
                expected[node_id] = expected.get(node_id, 0) + 1
        actual = {n: node.lock_ref for n, node in state.nodes.items() if n != 0 and node.lock_ref}
        assert actual == expected

    @invariant()
    def sglang_accounting_identity(self):
        if not hasattr(self, "cache"):
            return
        size = self.page_size
        uncached = 0
        for req in self.live.values():
            allocated = self._kv_len(req)
            uncached += -(-allocated // size) * size - req.cache_protected_len
        total = (self.allocator.available_size() + self.cache.evictable_size()
                 + self.cache.protected_size() + uncached)
        assert total == self.total


TestSGLangMachine = SGLangMachine.TestCase
