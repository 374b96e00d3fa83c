"""KV-event transport over ZeroMQ, wire-compatible with vLLM 0.33 (re-exports).

The transport lives in five modules; this one keeps the original import path:

* :mod:`kvstate.vllm.zmq_framing` -- ``END_SEQ`` and the frame layout (constants);
* :mod:`kvstate.vllm.zmq_publisher` -- :class:`ZmqEventPublisher` (owns its
  sockets and one background thread; ``publish`` only enqueues),
  :class:`KVEventsConfig`, :func:`offset_endpoint_port`;
* :mod:`kvstate.vllm.zmq_subscriber` -- :class:`KVEventSubscriber` (single-
  threaded, owns its sockets, fills gaps by replay, drops and counts hostile
  input), :class:`SequencedBatch`;
* :mod:`kvstate.vllm.zmq_replay` -- the bounded replay-socket client it uses;
* :mod:`kvstate.vllm.zmq_stats` -- :class:`SubscriberLimits`,
  :class:`SubscriberStats`, :class:`DropReason`, :class:`DroppedSample`.

Nothing here owns state.  Needs the optional ``pyzmq`` package.
"""

from __future__ import annotations

from kvstate.vllm.zmq_framing import END_SEQ
from kvstate.vllm.zmq_publisher import KVEventsConfig, ZmqEventPublisher, offset_endpoint_port
from kvstate.vllm.zmq_stats import DroppedSample, DropReason, SubscriberLimits, SubscriberStats
from kvstate.vllm.zmq_subscriber import KVEventSubscriber, SequencedBatch

__all__ = [
    "END_SEQ",
    "DropReason",
    "DroppedSample",
    "KVEventSubscriber",
    "KVEventsConfig",
    "SequencedBatch",
    "SubscriberLimits",
    "SubscriberStats",
    "ZmqEventPublisher",
    "offset_endpoint_port",
]
