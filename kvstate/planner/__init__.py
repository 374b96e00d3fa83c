"""The planner: all policy.  Pure functions ``(state, request) -> Plan``.

A ``Plan`` carries the events a decision produced and the state they lead
to; the planner builds it by applying each event with the pure reducer as it
goes, so a plan is valid by construction and the caller adopts ``plan.state``
without applying twice.  Policies (eviction order, free-list placement) are
parameters here and never reach the reducer: the events record outcomes.
"""

from kvstate.planner.builder import Plan, PlanBuilder
from kvstate.planner.evict import lru_priority, plan_evict
from kvstate.planner.tree_ops import InsertResult, MatchResult, plan_insert, plan_match

__all__ = [
    "InsertResult",
    "MatchResult",
    "Plan",
    "PlanBuilder",
    "lru_priority",
    "plan_evict",
    "plan_insert",
    "plan_match",
]
