"""The seeded simulation from a shell: replay one seed, or sweep many.

    python tests/sim/run.py --seed 1234 [--mode mongod] [--shards 5 --add-shards 3 ...] [-v]
    python tests/sim/run.py --seeds 1000 [--mode clock] [--real-shards on|off|auto]

``--real-shards``: data shards on the real shard cursor (``on``), on the model (``off``), or
every third seed (``auto``, the default, as the tests run them).

With ``--seed`` it prints the run's summary, its violations and (``-v``) what each stream
returned; without, it runs seeds 0..N-1 and prints the failing ones. Exit status 1 when any
seed has violations. The checkout this file is in comes first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve()
sys.path[:0] = [str(_HERE.parents[2]), str(_HERE.parents[1])]  # the checkout, tests/

from sim.shard_model import PROMISE_MODES  # noqa: E402
from sim.world import World, replay_hint  # noqa: E402


_REAL = {"auto": None, "on": True, "true": True, "off": False, "false": False}


def real_shards_arg(value: str) -> bool | None:
    """``--real-shards``: auto/on/off (True/False as :func:`sim.world.replay_hint` prints)."""
    try:
        return _REAL[value.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected one of {sorted(_REAL)}") from None


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (see the module docstring), run, print; 1 if a seed has violations."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    one = ap.add_mutually_exclusive_group()
    one.add_argument("--seed", type=int, help="replay this seed")
    one.add_argument("--seeds", type=int, default=1000, help="sweep seeds 0..N-1")
    ap.add_argument("--mode", choices=PROMISE_MODES, default="clock")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--add-shards", type=int, default=1)
    ap.add_argument("--writes", type=int, default=60)
    ap.add_argument("--resumes", type=int, default=2)
    ap.add_argument("--real-shards", type=real_shards_arg, default=None,
                    help="auto (every third seed, default), on or off")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each stream's events")
    args = ap.parse_args(argv)
    kw = {"mode": args.mode, "shards": args.shards, "add_shards": args.add_shards,
          "writes": args.writes, "resumes": args.resumes}
    if args.real_shards is not None:
        kw["real_shards"] = args.real_shards
    if args.seed is not None:
        return replay(args.seed, args.verbose, kw)
    t0 = time.perf_counter()
    bad = events = 0
    for seed in range(args.seeds):
        try:
            res = World(seed, **kw).run()
        except Exception:
            print(f"seed {seed} crashed\n  {replay_hint(seed, **kw)}")
            raise
        events += res.events
        if res.violations:
            bad += 1
            print(f"seed {seed}: {res.violations[:3]}\n  {replay_hint(seed, **kw)}")
    print(f"{args.seeds} seeds, mode {args.mode}: {bad} with violations, {events} events, "
          f"{time.perf_counter() - t0:.1f} s")
    return 1 if bad else 0


def replay(seed: int, verbose: bool, kw: dict) -> int:
    """Run one seed and print what happened."""
    world = World(seed, **kw)
    res = world.run()
    print(f"seed {seed} ({kw}): {res.events} events, {res.streams} streams, "
          f"{res.returned} returned; batch limit {world.batch_limit}, take {world.use_take}, "
          f"blocks {world.use_blocks}, vouched {world.vouch}, "
          f"promise replies {world.promise_replies}, real shards {world.real}")
    for st in world.streams if verbose else ():
        print(f"stream {st.sid} from {st.start_token['_data']} (resume {st.resume}): "
              f"{len(st.returned)} events, error {st.error}")
        for ev in st.returned:
            print(f"  {ev.key[0]}")
    for v in res.violations:
        print(f"VIOLATION {v}")
    return 1 if res.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
