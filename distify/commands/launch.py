"""`distify launch` (placeholder until its issue lands)."""

from __future__ import annotations

import click


@click.command(name="launch")
def launch() -> None:
    """Not implemented yet."""
    raise click.ClickException("distify launch is not implemented yet")
