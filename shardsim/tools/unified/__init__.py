"""Unified test format runner (schema 1.x) with pymongo as the driver.

``Runner(uri).run_paths([dir])`` runs every ``*.json`` test file there and returns
:class:`TestResult` objects; ``shardsim spec`` (``shardsim.tools.unified.cli``) wraps it. The matcher
(:mod:`shardsim.tools.unified.matcher`) and ``runOnRequirements`` logic
(:mod:`shardsim.tools.unified.requirements`) are pure and reusable.
"""

from .matcher import MatchError, Matcher, RunnerError
from .requirements import ServerInfo, skip_reason
from .runner import Runner, TestResult

__all__ = ["MatchError", "Matcher", "Runner", "RunnerError", "ServerInfo", "TestResult",
           "skip_reason"]
