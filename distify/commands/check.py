"""`distify check` (placeholder until its issue lands)."""

from __future__ import annotations

import click


@click.command(name="check")
def check() -> None:
    """Not implemented yet."""
    raise click.ClickException("distify check is not implemented yet")
