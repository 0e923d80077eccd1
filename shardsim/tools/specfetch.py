"""Fetch the change-streams + unified-test-format spec tests at a pinned commit.

``python -m shardsim.tools.specfetch --commit SHA --dest DIR`` (``make fetch-specs``) downloads the
source tarball of the public ``mongodb/specifications`` repository at ``SHA`` and extracts only
the JSON test files ``shardsim spec`` needs::

    DIR/change-streams/tests/unified/*.json
    DIR/unified-test-format/tests/valid-pass/*.json
    DIR/<suite>/tests[/unified]/*.json   (crud, transactions, retryable-writes, ... see OPTIONAL)
    DIR/SPEC_COMMIT                      (the commit they came from)

If ``DIR/SPEC_COMMIT`` already names ``SHA`` and the files are there, nothing is downloaded.
``--tarball FILE`` extracts from an archive fetched elsewhere (for machines without GitHub
access). Exit status: 0 on success, 2 when the download fails (the message says how to work
around it), 1 on a bad archive.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

REPO = "mongodb/specifications"
TARBALL_URL = "https://codeload.github.com/{repo}/tar.gz/{commit}"
# (directory inside the repository, destination directory under --dest)
WANTED = (
    ("source/change-streams/tests/unified", "change-streams/tests/unified"),
    ("source/unified-test-format/tests/valid-pass", "unified-test-format/tests/valid-pass"),
)
# The other unified suites ``shardsim spec --suite`` runs; extracted when the archive has them
# (the layout mirrors ../shared/specs: DIR/<suite>/tests[/unified]/*.json).
OPTIONAL = tuple((f"source/{d}", d) for d in (
    "crud/tests/unified", "transactions/tests/unified", "transactions-convenient-api/tests/unified",
    "retryable-writes/tests/unified", "retryable-reads/tests/unified", "sessions/tests",
    "collection-management/tests", "causal-consistency/tests", "index-management/tests",
    "run-command/tests/unified"))
MARKER = "SPEC_COMMIT"
TIMEOUT_S = 60


class FetchError(Exception):
    """A download or extraction problem; ``exit_code`` is 2 for network, 1 for bad archives."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def target_path(member: str) -> str | None:
    """Where a tarball member goes (relative to --dest), or None if it is not wanted.

    Members look like ``specifications-<sha>/source/change-streams/tests/unified/x.json``; only
    ``*.json`` files directly inside a wanted directory are kept. Absolute paths and ``..``
    components are rejected (returns None).
    """
    path = PurePosixPath(member)
    if path.is_absolute() or ".." in path.parts or len(path.parts) < 2:
        return None
    inner = PurePosixPath(*path.parts[1:])  # strip the archive's top-level directory
    if inner.suffix != ".json":
        return None
    for src, dst in WANTED + OPTIONAL:
        if str(inner.parent) == src:
            return f"{dst}/{inner.name}"
    return None


def is_present(dest: Path, commit: str) -> bool:
    """True when ``dest`` already holds the files of ``commit`` (skip the download)."""
    marker = dest / MARKER
    if not marker.is_file() or marker.read_text().strip() != commit:
        return False
    return all(any((dest / dst).glob("*.json")) for _src, dst in WANTED)


def download(commit: str, url: str | None = None, timeout: float = TIMEOUT_S) -> bytes:
    """The tarball bytes; FetchError(exit_code=2) with a clear message when offline."""
    url = url or TARBALL_URL.format(repo=REPO, commit=commit)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (fixed https URL)
            return resp.read()
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchError(
            f"cannot download {url}: {reason}.\n"
            f"This machine may have no access to GitHub. Either download that tarball elsewhere "
            f"and run `python -m shardsim.tools.specfetch --commit {commit} --tarball FILE --dest DIR`, "
            f"or point `shardsim spec --spec-dir` at a checkout of {REPO} "
            f"(source/change-streams/tests/unified).", exit_code=2) from None


def extract(data: bytes, dest: Path, commit: str) -> int:
    """Extract the wanted JSON files from tarball ``data`` into ``dest``; returns how many.

    Files are written to a temporary directory first and moved into place only when every
    wanted directory got at least one file, so a bad archive never leaves a half cache.
    """
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except tarfile.TarError as exc:
        raise FetchError(f"not a tar archive: {exc}") from None
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    with tar, tempfile.TemporaryDirectory(dir=dest) as tmp:
        staging = Path(tmp)
        for member in tar.getmembers():
            rel = target_path(member.name)
            if rel is None or not member.isfile():
                continue
            src = tar.extractfile(member)
            if src is None:
                continue
            out = staging / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(src.read())
            count += 1
        missing = [dst for _src, dst in WANTED if not any((staging / dst).glob("*.json"))]
        if missing:
            raise FetchError(f"archive has no test files for {', '.join(missing)} "
                             f"(is {commit} a commit of {REPO}?)")
        for _src, dst in WANTED + tuple(o for o in OPTIONAL if (staging / o[1]).is_dir()):
            final = dest / dst
            if final.exists():
                shutil.rmtree(final)
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(staging / dst), str(final))
    (dest / MARKER).write_text(commit + "\n")
    return count


def fetch(commit: str, dest: Path, *, tarball: Path | None = None, url: str | None = None,
          force: bool = False) -> str:
    """Make ``dest`` hold the spec tests of ``commit``; returns a one-line status message."""
    if not force and is_present(dest, commit):
        return f"spec tests of {commit} already in {dest}"
    data = tarball.read_bytes() if tarball is not None else download(commit, url)
    n = extract(data, dest, commit)
    return f"extracted {n} spec test files of {REPO}@{commit} into {dest}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardsim.tools.specfetch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", required=True, help="commit of mongodb/specifications")
    parser.add_argument("--dest", required=True, type=Path, help="cache directory")
    parser.add_argument("--tarball", type=Path, help="use this downloaded archive")
    parser.add_argument("--url", help="download from this URL instead of GitHub")
    parser.add_argument("--force", action="store_true", help="fetch even if present")
    args = parser.parse_args(argv)
    try:
        print(fetch(args.commit, args.dest, tarball=args.tarball, url=args.url, force=args.force))
    except FetchError as exc:
        print(f"specfetch: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
