"""Subcommands of the ``kvstate`` CLI: one module per command, each with ``register``."""
