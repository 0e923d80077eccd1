"""The router half of change streams (mongos): ``aggregate`` with ``$changeStream``."""

from router.change_stream.cursor import aggregate_change_stream, close_promise_channels

__all__ = ["aggregate_change_stream", "close_promise_channels"]
