"""Seeded simulation of sharded change streams: a test harness for the router's merge.

FoundationDB/TigerBeetle-style: everything runs in one process on a deterministic scheduler
driven by ``random.Random(seed)``, so an ordering bug found once is found again from its seed
(every failure prints it; ``python -m pytest tests/sim --seed N`` or
``python tests/sim/run.py --seed N`` replays it). The merge under test is the real router code
(``router.change_stream.async_results_merger.Merger`` / ``ChangeStreamMerge``, ``router.change_stream.raw_events.split_cursor``); the rest
of the cluster is modelled:

* :mod:`.scheduler` -- the seeded discrete-event scheduler (virtual milliseconds);
* :mod:`.shard_model` -- shards and the config server: skewed hybrid logical clocks, oplog
  holes (writes visible only after a commit delay), getMore answers with a
  postBatchResumeToken chosen by the promise mode (``clock``, ``mongod``, and the deliberately
  wrong ``unsafe-clock`` that proves the checkers find violations);
* :mod:`.stream` -- one client change stream through the router: drives the merge, opens
  cursors on new shards (``kNewShardDetected``), sends promise requests;
* :mod:`.world` -- the scenario: random writes, periodic no-ops, ``addShard``, a first
  stream and streams resumed mid-run from tokens the first one returned (:func:`.world.run_seed`);
* :mod:`.checkers` -- one module per invariant (order, completeness, no event released before
  every remote promised past it, postBatchResumeToken rules, no stream error).
"""
