"""The two backends the rules run on.

``persistent``: ``apply(state, event) -> State``, pure and total, on frozen
states (the explorer, the hypothesis machines, ``kvstate.testing``).
``live``: ``LiveState``, the same rules on plain mutable containers, changed
in place (the engine and replay); it freezes to a ``State`` on demand.
"""
