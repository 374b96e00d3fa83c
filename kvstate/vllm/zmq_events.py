"""KV-event transport over ZeroMQ, wire-compatible with vLLM 0.33 (re-exports).

The transport lives in three modules; this one keeps the original import path:

* :mod:`kvstate.vllm.zmq_framing` -- ``END_SEQ`` and the frame layout (constants);
* :mod:`kvstate.vllm.zmq_publisher` -- :class:`ZmqEventPublisher` (owns its
  sockets and one background thread; ``publish`` only enqueues),
  :class:`KVEventsConfig`, :func:`offset_endpoint_port`;
* :mod:`kvstate.vllm.zmq_subscriber` -- :class:`KVEventSubscriber` (single-
  threaded, owns its sockets, fills gaps by replay), :class:`SequencedBatch`.

Nothing here owns state.  Needs the optional ``pyzmq`` package.
"""

from __future__ import annotations

from kvstate.vllm.zmq_framing import END_SEQ
from kvstate.vllm.zmq_publisher import KVEventsConfig, ZmqEventPublisher, offset_endpoint_port
from kvstate.vllm.zmq_subscriber import KVEventSubscriber, SequencedBatch

__all__ = [
    "END_SEQ",
    "KVEventSubscriber",
    "KVEventsConfig",
    "SequencedBatch",
    "ZmqEventPublisher",
    "offset_endpoint_port",
]
