"""The executable specification of kvstate.

* ``specs.model``        a reference model with plain dicts, sets and lists:
                         obviously correct and slow; it accepts or rejects each
                         fact event exactly as the reducer must.
* ``specs.abstraction``  ``abstract(kvstate.State) -> ModelState`` (the refinement map).
* ``specs.invariants``   named ALWAYS, TRANSITIONS and SOMETIMES properties.

``SPEC.md`` lists every property with its id, meaning and the real bug it
prevents.  Nothing here imports torch, time, random or os.
"""
