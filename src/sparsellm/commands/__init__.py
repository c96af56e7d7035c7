"""Subcommands of the `sparsellm` CLI."""
