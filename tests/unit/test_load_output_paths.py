"""Where ``shardsim load`` writes load-result.json/png (``shardsim.tools.load.cli.output_paths``):
inside ``--out``, beside a ``--result`` given elsewhere, the current directory only by default."""

from __future__ import annotations

import os

from shardsim.tools.load.cli import output_paths


def test_out_directory_holds_both(tmp_path) -> None:
    out = tmp_path / "runs" / "r1"
    result, plot = output_paths(str(out), None, None)
    assert result == str(out / "load-result.json") and plot == str(out / "load-result.png")
    assert out.is_dir()


def test_plot_goes_beside_a_result_elsewhere(tmp_path) -> None:
    result, plot = output_paths(None, str(tmp_path / "x" / "mine.json"), None)
    assert plot == str(tmp_path / "x" / "mine.png") and (tmp_path / "x").is_dir()


def test_relative_names_are_taken_inside_out(tmp_path) -> None:
    result, plot = output_paths(str(tmp_path), "a.json", "b.png")
    assert (result, plot) == (str(tmp_path / "a.json"), str(tmp_path / "b.png"))


def test_default_is_the_current_directory() -> None:
    result, plot = output_paths(None, None, None)
    assert (result, plot) == (os.path.join(".", "load-result.json"),
                              os.path.join(".", "load-result.png"))
