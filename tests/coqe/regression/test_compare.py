"""``experiments/coqe_regression_compare.py``: the paired tables, and one-line refusals of the command lines a user
gets wrong (a run's name for the method, a fit's folder for the test's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import load_script

from lit_icl.core.results import result_row, write_results

SCRIPT = Path(__file__).resolve().parents[3] / "experiments" / "coqe_regression_compare.py"


def _test_run(folder: Path, method: str, error: float) -> str:
    rows = [result_row("mse", e * (1 + k), method=m, shift=shift, n_context=k)
            for m, e in ((method, error), ("least_squares", 0.5)) for shift in ("id", "orthant") for k in range(5)]
    write_results(folder, rows, {"config": {}})
    return str(folder)


def _compare(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    compare = load_script(SCRIPT)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    try:
        compare.main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_paired_difference_of_two_nets(tmp_path, monkeypatch, capsys) -> None:
    a = [_test_run(tmp_path / f"a{s}", "coqe", 1.0 + s) for s in range(2)]
    b = [_test_run(tmp_path / f"b{s}", "transformer", 2.0) for s in range(2)]
    code, out, _ = _compare(monkeypatch, capsys, "--a", "coqe", *a, "--b", "transformer", *b)
    assert code == 0
    # k = 0: coqe 1.0 and 2.0 (mean 1.5), the transformer 2.0; paired differences -1.0 and 0.0
    assert "| id | coqe | 1.500 ± 0.707 |" in out and "| id | transformer | 2.000 ± 0.000 |" in out
    assert "| id | -0.500 ± 0.707 |" in out


@pytest.mark.parametrize(("wrong", "needle"), [
    ("name", "--a coqe_s0: {a} has no rows of method 'coqe_s0'; its methods are coqe, least_squares"),
    ("fit folder", "{fit}/results.json not found; pass a run folder written by `python -m lit_icl test`"),
])
def test_a_wrong_name_or_folder_is_one_line_and_status_2(tmp_path, monkeypatch, capsys, wrong, needle) -> None:
    """Both ended in a Python traceback (a KeyError, a FileNotFoundError)."""
    a, b = _test_run(tmp_path / "a", "coqe", 1.0), _test_run(tmp_path / "b", "transformer", 2.0)
    (tmp_path / "fit").mkdir()
    first = ["--a", "coqe_s0", a] if wrong == "name" else ["--a", "coqe", str(tmp_path / "fit")]
    argv = [*first, "--b", "transformer", b]
    code, out, err = _compare(monkeypatch, capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("coqe_regression_compare.py: error: " + needle.format(a=a, fit=tmp_path / "fit"))


@pytest.mark.parametrize("fig", ["plot.pngx", "notes.txt/plot.png"], ids=["extension", "folder is a file"])
def test_a_figure_file_matplotlib_cannot_write_is_refused_before_the_tables(tmp_path, monkeypatch, capsys, fig) -> None:
    """The tables were printed, then matplotlib raised a traceback (ValueError, FileExistsError) at the figure."""
    (tmp_path / "notes.txt").write_text("")
    a, b = _test_run(tmp_path / "a", "coqe", 1.0), _test_run(tmp_path / "b", "transformer", 2.0)
    code, out, err = _compare(monkeypatch, capsys, "--a", "coqe", a, "--b", "transformer", b,
                              "--fig", str(tmp_path / fig))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"coqe_regression_compare.py: error: --fig {tmp_path / fig}: ")


def test_one_run_per_net_shows_no_spread(tmp_path, monkeypatch, capsys) -> None:
    """One run has no sd; the cell read ``± 0.000`` as if the runs had agreed."""
    a, b = _test_run(tmp_path / "a", "coqe", 1.0), _test_run(tmp_path / "b", "transformer", 2.0)
    code, out, _ = _compare(monkeypatch, capsys, "--a", "coqe", a, "--b", "transformer", b)
    assert code == 0 and "| id | coqe | 1.000 | 2.000 | 3.000 | 5.000 |" in out and "± 0.000" not in out
