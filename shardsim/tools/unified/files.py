"""Finding and parsing unified test files (Extended JSON, as the spec repository ships them)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from bson import json_util
from bson.json_util import JSONOptions

JSON_OPTIONS = JSONOptions(document_class=dict, tz_aware=False)


def load_test_file(path: str | Path) -> dict:
    """Parse a unified test file (Extended JSON). YAML files are not read (JSON is canonical here)."""
    text = Path(path).read_text(encoding="utf-8")
    return json_util.loads(text, json_options=JSON_OPTIONS)


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """The ``*.json`` test files under the given files/directories, sorted by name."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found.extend(sorted(x for x in p.glob("*.json") if x.is_file()))
        elif p.is_file():
            found.append(p)
        else:
            raise FileNotFoundError(f"no such spec file or directory: {p}")
    return found
