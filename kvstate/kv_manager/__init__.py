"""Seed 002's ``KVCacheManager`` on the event-sourced core (see ``manager.py``)."""

from kvstate.kv_manager.errors import ModeError, ReservationExceeded
from kvstate.kv_manager.manager import KVCacheManager

__all__ = ["KVCacheManager", "ModeError", "ReservationExceeded"]
