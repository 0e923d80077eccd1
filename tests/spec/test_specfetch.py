"""Offline tests of ``shardsim.tools.specfetch`` (this machine cannot reach GitHub)."""

from __future__ import annotations

import io
import socket
import tarfile

import pytest

from shardsim.tools import specfetch

SHA = "92b3c0b9"


def make_tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


GOOD = {
    f"specifications-{SHA}/source/change-streams/tests/unified/a.json": b'{"x": 1}',
    f"specifications-{SHA}/source/change-streams/tests/unified/a.yml": b"x: 1",
    f"specifications-{SHA}/source/change-streams/tests/README.md": b"readme",
    f"specifications-{SHA}/source/unified-test-format/tests/valid-pass/b.json": b'{"y": 2}',
    f"specifications-{SHA}/source/unified-test-format/tests/invalid/c.json": b"{}",
}


def test_target_path_mapping_and_safety():
    tp = specfetch.target_path
    assert tp("specifications-x/source/change-streams/tests/unified/a.json") == \
        "change-streams/tests/unified/a.json"
    assert tp("s/source/unified-test-format/tests/valid-pass/b.json") == \
        "unified-test-format/tests/valid-pass/b.json"
    assert tp("s/source/change-streams/tests/unified/a.yml") is None
    assert tp("s/source/change-streams/tests/unified/sub/a.json") is None
    assert tp("s/source/unified-test-format/tests/invalid/c.json") is None
    assert tp("/source/change-streams/tests/unified/a.json") is None
    assert tp("s/../source/change-streams/tests/unified/a.json") is None


def test_extract_then_skip_if_present(tmp_path):
    dest = tmp_path / "cache"
    msg = specfetch.fetch(SHA, dest, tarball=_write(tmp_path, make_tarball(GOOD)))
    assert "extracted 2" in msg
    assert (dest / "change-streams/tests/unified/a.json").read_bytes() == b'{"x": 1}'
    assert (dest / "unified-test-format/tests/valid-pass/b.json").exists()
    assert not (dest / "change-streams/tests/unified/a.yml").exists()
    assert (dest / "SPEC_COMMIT").read_text().strip() == SHA
    assert specfetch.is_present(dest, SHA)
    assert not specfetch.is_present(dest, "deadbeef")
    # present: no download attempted even with an unreachable URL
    assert "already" in specfetch.fetch(SHA, dest, url="http://127.0.0.1:9/none")


def test_bad_archive_leaves_no_cache(tmp_path):
    dest = tmp_path / "cache"
    partial = {k: v for k, v in GOOD.items() if "valid-pass" not in k}
    with pytest.raises(specfetch.FetchError, match="no test files"):
        specfetch.fetch(SHA, dest, tarball=_write(tmp_path, make_tarball(partial)))
    assert not (dest / "change-streams").exists()
    assert not specfetch.is_present(dest, SHA)
    with pytest.raises(specfetch.FetchError, match="not a tar"):
        specfetch.extract(b"not a tarball", dest, SHA)


def test_offline_download_gives_a_clear_error(tmp_path, capsys):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = specfetch.main(["--commit", SHA, "--dest", str(tmp_path / "c"),
                         "--url", f"http://127.0.0.1:{port}/x.tar.gz"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "cannot download" in err and "--tarball" in err


def _write(tmp_path, data: bytes):
    p = tmp_path / "specs.tar.gz"
    p.write_bytes(data)
    return p


def test_suite_names_and_dirs():
    """`shardsim spec --suite`: `all` expands to the suites found, each to its JSON directory."""
    import click
    import pytest as _pytest
    from shardsim.tools.unified import cli
    names = cli.suite_names(("crud", "all", "crud"))
    assert names[0] == "crud" and names.count("crud") == 1
    assert set(names) <= set(cli.SUITES)
    for name in names:
        d = cli.suite_dir(name)
        assert any(d.glob("*.json")) and name in str(d)
    with _pytest.raises(click.ClickException):
        cli.suite_dir("no-such-suite")
