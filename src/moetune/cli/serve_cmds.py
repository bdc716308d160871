"""Commands of a later stage (registered as they land)."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    pass
