"""Seeded simulation of sharded change streams: a test harness for the router's merge.

FoundationDB/TigerBeetle-style: everything runs in one process on a deterministic scheduler
driven by ``random.Random(seed)``, so an ordering bug found once is found again from its seed
(every failure prints it; ``python -m pytest tests/sim --seed N`` or
``python tests/sim/run.py --seed N`` replays it). The merge under test is the real router code
(``router.change_stream.async_results_merger.Merger`` / ``ChangeStreamMerge``,
``router.change_stream.raw_events.split_cursor``); on a third of the seeds the shards' cursors
are the real shard code too; the rest of the cluster is modelled:

* :mod:`.scheduler` -- the seeded discrete-event scheduler (virtual milliseconds);
* :mod:`.shard_model` -- shards and the config server: skewed hybrid logical clocks, oplog
  holes (writes visible only after a commit delay), getMore answers with a
  postBatchResumeToken chosen by the promise mode (``clock``, ``mongod``, and the deliberately
  wrong ``unsafe-clock`` that proves the checkers find violations);
* :mod:`.stream` -- one client change stream through the router: drives the merge, opens
  cursors on new shards (``kNewShardDetected``), sends promise requests;
* :mod:`.real_shard` -- on every third seed (``seed % 3 == 2``, or ``--real-shards on``), data
  shards that run shardsim's real shard change-stream code instead of the model: the shard's
  ``aggregate`` and ``getMore`` (``ChangeStreamCursor`` with the pipeline of
  ``shard/change_stream/pipeline.py``) over a real in-memory ``Oplog`` fed the simulation's
  inserts as they become visible, each call run to completion at once (``maxTimeMS: 0``), the
  waiting modelled by parking the cursor as its ``_wait`` does (real oplog appends and promise
  requests wake it); the replies go through the router's own reply parser;
* :mod:`.world` -- the scenario: random writes, periodic no-ops, ``addShard``, a first
  stream and streams resumed mid-run from tokens the first one returned (:func:`.world.run_seed`);
* :mod:`.checkers` -- one module per invariant (order, completeness, no event released before
  every remote promised past it, postBatchResumeToken rules, no stream error).

The replica-set simulation lives beside it: :mod:`.repl_world` runs 3- and 5-member sets of the
replication core (``shardsim/core/repl/``) on the same scheduler, :mod:`.repl_checkers` holds one
checker per invariant (election safety, log matching, commit point monotonic, no acknowledged
write lost, no uncommitted entry exposed, liveness), ``repl_run.py --seed N`` replays a seed.
"""
