"""The planner: all policy.  Functions ``plan_*(b, ...)`` decide and emit events into a builder.

A builder (``kvstate.planner.builder``) is the engine's open batch, or a
standalone ``PlanBuilder`` over a frozen state.  Policies (eviction order,
free-list placement) are parameters here and never reach the rules: the
events record outcomes, so logs replay whatever the policy was.
"""

from kvstate.planner.builder import Builder, Plan, PlanBuilder
from kvstate.planner.evict import fifo_priority, lru_priority, plan_evict
from kvstate.planner.tree_ops import InsertResult, MatchResult, plan_insert, plan_match

__all__ = [
    "Builder",
    "InsertResult",
    "MatchResult",
    "Plan",
    "PlanBuilder",
    "fifo_priority",
    "lru_priority",
    "plan_evict",
    "plan_insert",
    "plan_match",
]
