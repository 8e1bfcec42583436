"""The results format: tidy rows, checked, and files that round-trip."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from PIL import Image

from lit_icl.core.figures import line_figure
from lit_icl.core.results import csv_columns, load_results, result_row, write_results


def test_result_rows_are_tidy_and_checked() -> None:
    row = result_row("accuracy", torch.tensor(0.5), method="m", label_ratio=0.25)
    assert row == {"metric": "accuracy", "value": 0.5, "split": "test", "method": "m", "label_ratio": 0.25}
    assert isinstance(row["value"], float)
    with pytest.raises(ValueError, match="metric name"):
        result_row("", 1.0, method="m")
    with pytest.raises(ValueError, match="JSON scalars"):
        result_row("accuracy", 1.0, method="m", ratios=[0.1])
    assert csv_columns([{"metric": 1, "value": 1, "split": 1, "method": 1, "b": 1}, {"a": 2}]) == [
        "metric", "value", "split", "method", "b", "a"]


def test_results_files_round_trip(tmp_path) -> None:
    rows = [result_row("accuracy", 0.1 * i, method="m", label_ratio=r) for i, r in enumerate([0.1, 0.2])]
    rows.append(result_row("parameters", 11433, method="m"))
    fig = line_figure(rows, "label_ratio", metric="accuracy")
    write_results(tmp_path, rows, {"seeds": {"seed_everything": 3}}, {"acc": fig})
    loaded = load_results(tmp_path)
    assert loaded["rows"] == rows and loaded["meta"]["seeds"]["seed_everything"] == 3
    with open(tmp_path / "results.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [float(r["value"]) for r in table] == [r["value"] for r in rows]
    assert table[-1]["label_ratio"] == ""  # the parameter count has no label ratio
    assert Image.open(tmp_path / "acc.png").format == "PNG"
    (tmp_path / "bad.json").write_text(json.dumps({"results": []}))
    with pytest.raises(ValueError, match="not a lit_icl results file"):
        load_results(tmp_path / "bad.json")


def test_a_tests_meta_says_which_command_commit_and_machine_made_it(tmp_path, monkeypatch) -> None:
    """``meta`` named the versions only, and lit_icl's does not change between commits: a results.json could not
    be traced to the code, command or machine that made it."""
    import subprocess
    import sys
    from pathlib import Path

    from lit_icl.core.results import provenance

    monkeypatch.setattr(sys, "argv", ["lit_icl", "test", "--config", "my config.yaml"])
    meta = provenance()
    assert meta["command"] == f"{Path(sys.executable).name} lit_icl test --config 'my config.yaml'"
    monkeypatch.setattr(sys, "argv", ["/somewhere/lit_icl/__main__.py", "fit"])
    assert provenance()["command"] == f"{Path(sys.executable).name} -m lit_icl fit"
    assert meta["machine"]["cpus"] and meta["machine"]["host"] and isinstance(meta["machine"]["gpus"], list)
    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode == 0:  # a git checkout: the commit of the code that ran
        assert meta["commit"] == head.stdout.strip() and isinstance(meta["dirty"], bool)
    else:
        assert meta["commit"] is None and meta["dirty"] is None
