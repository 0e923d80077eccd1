"""ReplError raised through a context manager (``max_time.deadline_scope`` around every
command): contextlib re-raises it and sets ``__traceback__``, which a frozen dataclass refused
(FrozenInstanceError in place of 13436 NotPrimaryOrSecondary: failover trials, issue 25)."""

from __future__ import annotations

import contextlib

import pytest

from shardsim.core.repl.member_state import ReplError


def test_repl_error_survives_a_context_manager_and_compares_by_value() -> None:
    @contextlib.contextmanager
    def scope():
        yield

    with pytest.raises(ReplError) as info:
        with scope():
            raise ReplError(13436, "NotPrimaryOrSecondary",
                            "node is not in primary or recovering state")
    assert info.value.to_doc()["code"] == 13436
    assert info.value == ReplError(13436, "NotPrimaryOrSecondary",
                                   "node is not in primary or recovering state")
    assert hash(info.value) is not None
