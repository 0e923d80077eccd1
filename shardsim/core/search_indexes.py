"""Atlas Search index commands as a mongod or mongos 8.0 without Atlas answers them:
``createSearchIndexes``, ``updateSearchIndex``, ``dropSearchIndex`` and the
``$listSearchIndexes`` stage (plus ``$search``/``$searchMeta``/``$vectorSearch``).

The server registers the commands on both mongod and mongos
(``src/mongo/db/commands/search_index_commands.cpp``); each ``typedRun`` starts with
``throwIfNotRunningWithRemoteSearchIndexManagement()`` (``search_index_helpers.cpp``), which
fails with SearchNotEnabled (31082) while the ``searchIndexManagementHostAndPort`` parameter is
empty, before the namespace or the index definitions are looked at. shardsim has no search
index management host, so every call gets that error, whatever the collection; the stages do
the same at parse time (``document_source_list_search_indexes.cpp``,
``search_helper.cpp``'s ``throwIfNotRunningWithMongotHostConfigured``).
"""

from __future__ import annotations

from typing import Any

from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.auth import privileges as priv

commands = CommandFamily("search_indexes")

SEARCH_NOT_ENABLED = 31082

#: throwIfNotRunningWithRemoteSearchIndexManagement's message (search_index_helpers.cpp)
INDEX_MANAGEMENT_MESSAGE = (
    "Using Atlas Search Database Commands and the $listSearchIndexes aggregation stage "
    "requires additional configuration. Please connect to Atlas or an AtlasCLI local "
    "deployment to enable. For more information on how to connect, see "
    "https://dochub.mongodb.org/core/atlas-cli-deploy-local-reqs.")

#: throwIfNotRunningWithMongotHostConfigured's message (search_helper.cpp), $search and friends
SEARCH_STAGE_MESSAGE = (
    "Using $search and $vectorSearch aggregation stages requires additional configuration. "
    "Please connect to Atlas or an AtlasCLI local deployment to enable. For more information "
    "on how to connect, see https://dochub.mongodb.org/core/atlas-cli-deploy-local-reqs.")

SEARCH_STAGES = frozenset({"$search", "$searchMeta", "$vectorSearch"})


def search_not_enabled() -> MongoError:
    """The SearchNotEnabled (31082) error of the search index commands."""
    return MongoError(SEARCH_NOT_ENABLED, INDEX_MANAGEMENT_MESSAGE)


def check_search_stages(pipeline: Any) -> None:
    """Raise SearchNotEnabled (31082) when ``pipeline`` (a list of stage documents; anything
    else is left to the caller's own checks) has ``$listSearchIndexes``, ``$search``,
    ``$searchMeta`` or ``$vectorSearch`` at any position."""
    if not isinstance(pipeline, list):
        return
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1:
            continue
        name = next(iter(stage))
        if name == "$listSearchIndexes":
            raise search_not_enabled()
        if name in SEARCH_STAGES:
            raise MongoError(SEARCH_NOT_ENABLED, SEARCH_STAGE_MESSAGE)


@commands.handler("createSearchIndexes", privileges=priv.on_coll("createSearchIndexes"))
@commands.handler("updateSearchIndex", privileges=priv.on_coll("updateSearchIndex"))
@commands.handler("dropSearchIndex", privileges=priv.on_coll("dropSearchIndex"))
async def search_index_command(node: Any, req: Request) -> dict[str, Any]:
    """``createSearchIndexes``/``updateSearchIndex``/``dropSearchIndex``: always
    SearchNotEnabled (31082), as a server without ``searchIndexManagementHostAndPort``."""
    raise search_not_enabled()
