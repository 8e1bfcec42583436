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
