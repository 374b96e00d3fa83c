"""Frame layout shared by the ZeroMQ KV-event publisher and subscriber (vLLM 0.33's wire).

Live messages on the PUB socket are three frames ``[topic, seq, payload]``;
``seq`` is ``SEQ_BYTES`` big-endian bytes counting from 0.  A replay request
to the ROUTER socket is ``[identity, b"", start_seq]``; each reply message is
``[topic, seq, payload]`` after the envelope (``[seq, payload]`` in the older
form), and the reply ends with ``END_SEQ`` and an empty payload.

Constants only: nothing here owns state or mutates anything.
"""

from __future__ import annotations

__all__ = ["END_SEQ", "SEQ_BYTES"]

SEQ_BYTES = 8
"""Width of a sequence-number frame (big-endian)."""

END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
"""Sequence frame of the replay end marker."""
