"""Seed 002's ``KVCacheManager`` on the event-sourced core (see ``manager.py``).

The decisions live in ``kvstate.planner.kv_manager``; this package keeps the
seed's API, its errors, its argument checks and the K/V values.
"""

from kvstate.kv_manager.errors import BufferAllocationError, ModeError, ReservationExceeded
from kvstate.kv_manager.manager import KVCacheManager

__all__ = ["BufferAllocationError", "KVCacheManager", "ModeError", "ReservationExceeded"]
