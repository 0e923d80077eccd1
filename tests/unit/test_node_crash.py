"""``crash()`` of each role's node: what the test kit's ``kill_shard`` calls (after dropping the
connections with ``Server.abort``) instead of reaching into the node's private attributes."""

from __future__ import annotations

import asyncio
from typing import Any

from shardsim.configsvr.node import ConfigServerNode
from shardsim.core.server import Server
from shardsim.router.node import RouterNode
from shardsim.shard.durable import DurableStore
from shardsim.shard.node import ShardNode


def test_a_crashed_durable_shard_lets_go_of_its_dbpath_without_a_checkpoint(tmp_path: Any) -> None:
    async def main() -> None:
        server = Server(ShardNode(shard_name="s0", options={"dbpath": str(tmp_path)}))
        await server.start()
        node = server.node
        node.write_noop({"msg": "before the crash"})
        node.flush()
        writer, reaper = node.noop_writer_task, node.sessions._reaper
        server.abort()
        node.crash()
        await asyncio.sleep(0)
        assert node.durable is None
        assert writer.cancelled() or writer.done()
        assert reaper is not None and (reaper.cancelled() or reaper.done())
        DurableStore(str(tmp_path)).close()  # the lock is free: a restart can open the store
    asyncio.run(main())


def test_router_and_config_server_crash_stop_their_tasks_and_pools() -> None:
    async def main() -> None:
        config = Server(ConfigServerNode())
        await config.start()
        router = Server(RouterNode(configdb=f"127.0.0.1:{config.port}",
                                   options={"configdb": f"127.0.0.1:{config.port}"}))
        await router.start()
        refresher = router.node._refresher
        router.abort()
        router.node.crash()
        config.abort()
        config.node.crash()
        await asyncio.sleep(0)
        assert refresher.cancelled() or refresher.done()
        assert config.node.durable is None
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()
    asyncio.run(main())
