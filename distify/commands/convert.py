"""`distify convert` (placeholder until its issue lands)."""

from __future__ import annotations

import click


@click.command(name="convert")
def convert() -> None:
    """Not implemented yet."""
    raise click.ClickException("distify convert is not implemented yet")
