"""The hybrid logical clock: monotonic ticks, gossip never moves it back (VectorClock semantics)."""

from bson.timestamp import Timestamp

from shardsim.core.clock import HybridLogicalClock, ts_add_ticks, ts_from_key, ts_key


class FakeWall:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_tick_uses_wall_seconds_then_increments():
    wall = FakeWall(1000.5)
    clock = HybridLogicalClock(wall)
    assert clock.tick() == Timestamp(1000, 1)
    assert clock.tick() == Timestamp(1000, 2)
    wall.t = 1001.0
    assert clock.tick() == Timestamp(1001, 1)


def test_tick_never_goes_back_when_wall_clock_does():
    wall = FakeWall(2000)
    clock = HybridLogicalClock(wall)
    clock.tick()
    wall.t = 1500
    assert clock.tick() == Timestamp(2000, 2)


def test_gossip_advances_but_never_regresses():
    clock = HybridLogicalClock(FakeWall(10))
    clock.advance(Timestamp(50, 7))
    assert clock.now() == Timestamp(50, 7)
    clock.advance(Timestamp(20, 1))
    assert clock.now() == Timestamp(50, 7)
    assert clock.tick() == Timestamp(50, 8)


def test_reserving_several_ticks_returns_the_first():
    clock = HybridLogicalClock(FakeWall(10))
    first = clock.tick(5)
    assert first == Timestamp(10, 1)
    assert clock.now() == Timestamp(10, 5)


def test_key_round_trip_and_carry():
    ts = Timestamp(123, 0xFFFFFFFF)
    assert ts_from_key(ts_key(ts)) == ts
    assert ts_add_ticks(ts) == Timestamp(124, 0)


def test_next_tick_key_is_what_tick_reserves_without_reserving_it():
    """``next_tick_key`` (the router's early promise requests) equals the key the next
    ``tick`` returns, in the same second, when the wall clock moved on, and at the increment's
    limit; it reserves nothing."""
    from shardsim.core.clock import MAX_TIME_VALUE, ts_key
    wall = [100.0]
    c = HybridLogicalClock(wall=lambda: wall[0])
    for _ in range(3):
        k = c.next_tick_key()
        assert c.next_tick_key() == k  # nothing reserved
        assert ts_key(c.tick()) == k
    wall[0] = 101.5
    k = c.next_tick_key()
    assert k == (101 << 32) | 1 and ts_key(c.tick()) == k
    c = HybridLogicalClock(wall=lambda: 5.0, start=Timestamp(5, MAX_TIME_VALUE))
    k = c.next_tick_key()
    assert k == (6 << 32) | 1 and ts_key(c.tick()) == k


def test_now_follows_every_move_of_the_clock():
    # now() reuses its last Timestamp while the time has not moved: every way the clock moves
    # must show in the next now()
    wall = FakeWall(100)
    clock = HybridLogicalClock(wall)
    assert clock.now() == Timestamp(0, 0)
    clock.tick()
    assert clock.now() == Timestamp(100, 1)
    assert clock.now() is clock.now()
    clock.tick(3)
    assert clock.now() == Timestamp(100, 4)
    clock.advance(Timestamp(150, 2))
    assert clock.now() == Timestamp(150, 2)
    clock.restore(Timestamp(160, 9))
    assert clock.now() == Timestamp(160, 9)
    wall.t = 200
    assert clock.advance_to_wall() == Timestamp(200, 0)
    assert clock.now() == Timestamp(200, 0)
    assert clock.try_advance(Timestamp(201, 1))
    assert clock.now() == Timestamp(201, 1)
    started = HybridLogicalClock(wall, start=Timestamp(300, 3))
    assert started.now() == Timestamp(300, 3)
