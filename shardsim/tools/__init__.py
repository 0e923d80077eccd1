"""The tools above the roles: the ``shardsim`` CLI, the launcher, the fault CLI, ``top``, the
unified spec runner, the PySpark load generator and the spec fetcher. They start roles as
processes (``python -m shardsim.<role>``) and never import a role."""
