"""``experiments/figures.py`` draws each docs page's figure from the committed results CSVs, and every CSV value
is the one in its Markdown results table (the CSVs are copies, not new measurements)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "experiments/results"


def _script():
    spec = importlib.util.spec_from_file_location("experiment_figures", ROOT / "experiments/figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(md: str, header_start: str) -> tuple[list[str], dict[str, list[str]]]:
    """The Markdown table whose header line starts with ``header_start``: its header cells, rows by first cell."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    cells = [[c.strip().strip("*") for c in line.strip().strip("|").split("|")]
             for line in lines[start:] if line.startswith("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().strip("*") for c in line.strip().strip("|").split("|")])
    return cells[0], {r[0]: r[1:] for r in rows}


def _csv(name: str) -> list[dict[str, str]]:
    with open(RESULTS / name, newline="") as f:
        return list(csv.DictReader(f))


def test_every_figure_is_drawn_from_the_committed_results(tmp_path: Path) -> None:
    assert _script().main(["all", "--out", str(tmp_path)]) == 0
    for name in ("icssl", "mmca_synthetic", "mmca_avmnist", "i2cl"):
        png = tmp_path / f"{name}_cpu.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert (ROOT / "docs/figures" / png.name).is_file(), f"docs/figures/{png.name} is not committed"


@pytest.mark.parametrize("results, problem", [("nowhere", "no such folder"),
                                              ("empty", "lacks icssl_cpu_cylinder.csv, which the icssl figure reads")])
def test_a_results_folder_without_the_csvs_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, results,
                                                                                         problem) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as stop:
        _script().main(["icssl", "--results", str(tmp_path / results), "--out", str(tmp_path / "figures")])
    assert stop.value.code == 2 and problem in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "figures").exists()


@pytest.mark.parametrize(
    ("csv_name", "md_name", "header", "row_key", "column"),
    [
        ("icssl_cpu_cylinder.csv", "icssl_cpu.md", "| model (`--model...representation`, head)",
         lambda r: r["method"], lambda r, h: h.index(f"{r['label_ratio_pct']} %")),
        ("mmca_synthetic_cpu.csv", "mmca_synthetic_cpu.md", "| method (config)",
         lambda r: r["method"] + (f" (`{r['config']}`)" if r["config"] else ""),
         lambda r, h: next(i for i, c in enumerate(h) if c.split()[-1] == r["L_te"])),
    ],
)
def test_csv_values_are_the_markdown_tables(csv_name, md_name, header, row_key, column) -> None:
    head, rows = _table((RESULTS / md_name).read_text(), header)
    values = [r for r in _csv(csv_name)]
    assert values
    for r in values:
        value = r["accuracy"] if "accuracy" in r else r["icl_error"]
        assert rows[row_key(r)][column(r, head) - 1] == value, r


def test_avmnist_csv_holds_the_per_seed_columns() -> None:
    md = (RESULTS / "mmca_avmnist_cpu.md").read_text()
    tables = {"0.2": _table(md, "| model | params | best test acc. (%) | per seed")[1],
              "1.0": _table(md, "| model (sd 1.0)")[1]}
    rows = _csv("mmca_avmnist_cpu.csv")
    assert len(rows) == 30
    for r in rows:
        assert tables[r["noise_std"]][r["model"]][2].split(" / ")[int(r["seed"])] == r["best_test_accuracy_pct"], r


def test_i2cl_csv_holds_the_per_seed_lists_of_its_results_files() -> None:
    """Each (model, setting, method) group of i2cl_offline_cpu.csv is a per-seed list written, in seed order, in
    that model's results file."""
    files = {"SmolLM2-135M-Instruct": "i2cl_offline_cpu.md", "Gemma 3 270M": "i2cl_offline_gemma_cpu.md"}
    groups: dict[tuple[str, str, str], list[str]] = {}
    for r in _csv("i2cl_offline_cpu.csv"):
        groups.setdefault((r["model"], r["setting"], r["method"]), []).append(r["accuracy"])
    assert {model for model, _, _ in groups} == set(files)
    for (model, setting, method), values in groups.items():
        assert ", ".join(values) in (RESULTS / files[model]).read_text(), (model, setting, method)
