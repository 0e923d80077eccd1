"""The kit's ``step_down`` when the stepped-down primary wins the next election again (found
by the failover trials, issue 25: ``stepdown`` seed 1002 with ``secs=1``)."""

from __future__ import annotations

import pytest

from shardsim.testing import ReplicaSet

pytestmark = pytest.mark.timeout(120)


def test_step_down_returns_when_the_old_primary_is_elected_again() -> None:
    with ReplicaSet(members=3, seed=11) as rs:
        old = rs.primary_of()
        for host in rs.members_of():  # no secondary may stand: only the old primary
            if host != old:
                member = rs.rs._member_at(host).name
                rs._call(rs.rs.command(member, {"replSetFreeze": 60}))
        assert rs.step_down(1) == old  # raised NoPrimary after 15 s before
        assert rs.primary_of() == old
