"""Oplog administration: ``replSetResizeOplog`` (``src/mongo/db/commands/resize_oplog.cpp``).

The size and retention are validated by :mod:`shard.oplog_settings` as the command's IDL does
(TypeMismatch 14 for a non-number, 51024 outside 990..1073741824 MB or for negative hours), so
no bad value ever cuts the oplog's history.
"""

from __future__ import annotations

from typing import Any

from shardsim.shard.oplog_settings import _number, check_min_retention_hours, check_size_mb
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.auth import privileges as priv

commands = CommandFamily("oplog")


@commands.handler("replSetResizeOplog", privileges=priv.on_cluster("replSetResizeOplog"))
async def repl_set_resize_oplog(node: Any, req: Request) -> dict[str, Any]:
    """``{replSetResizeOplog: 1, size: <MB, double>, minRetentionHours: <double>}`` -> ``{}``;
    applies the new cap at once (truncating the oldest entries beyond it)."""
    _number(req.arg, "replSetResizeOplog.replSetResizeOplog")
    size_mb = check_size_mb(req.body.get("size")) if "size" in req.body else None
    min_h = (check_min_retention_hours(req.body.get("minRetentionHours"))
             if "minRetentionHours" in req.body else None)
    if size_mb is not None:
        node.oplog.max_bytes = int(size_mb * 1024 * 1024)
    if min_h is not None:
        node.oplog.min_retention_s = min_h * 3600
    node.oplog.truncate()
    return {}
