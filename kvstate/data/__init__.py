"""Package data: the bundled demo log (``demo.kvlog``)."""
