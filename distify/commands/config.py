"""`distify config` (placeholder until its issue lands)."""

from __future__ import annotations

import click


@click.command(name="config")
def config() -> None:
    """Not implemented yet."""
    raise click.ClickException("distify config is not implemented yet")
