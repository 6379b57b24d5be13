"""Subcommands of the dynacp CLI (one module each)."""
