"""``view_error``, kept importable here while the shared core moves (the catalog commands that
lived in this module are now in :mod:`shard.commands.ddl`, :mod:`shard.commands.catalog` and
:mod:`shard.commands.internal`)."""

from __future__ import annotations

from shardsim.errors import MongoError


def view_error(ns: str) -> MongoError:
    """CommandNotSupportedOnView (166) as ``AutoGetCollection`` raises it for a view."""
    return MongoError(166, f"Namespace {ns} is a view, not a collection")
