"""I2CL's configs say what they run: every Table 1 overlay sets the task it is named after, the offline ones read
JSONL files (the checks every config passes are in tests/test_configs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_configs import COMBINATIONS, combo_id, print_config

I2CL = [files for files in COMBINATIONS if files[0].startswith("configs/i2cl/")]


def test_both_experiments_have_their_overlays() -> None:
    bases = [files[0] for files in I2CL if len(files) == 1]
    assert bases == ["configs/i2cl/offline.yaml", "configs/i2cl/table1.yaml"] and len(I2CL) == 17


@pytest.mark.parametrize("files", I2CL, ids=combo_id)
def test_config_runs_the_task_its_name_says(files: tuple[str, ...]) -> None:
    merged = print_config(files)
    assert merged["model"]["class_path"] == "lit_icl.i2cl.I2CLModule"
    experiment = Path(files[0]).stem
    variants = [Path(f).stem for f in files[1:]]
    name = merged["trainer"]["logger"]["init_args"]["name"]
    if experiment == "table1":
        task = variants[0] if variants else "sst2"
        assert name == f"i2cl_{task}" and merged["data"]["init_args"]["task"] == task
    else:  # runs/i2cl_offline_<variant>: the transfer overlay reads the anchors' folders by these names
        assert name == "_".join(["i2cl", experiment, *variants])
        assert merged["data"]["init_args"]["task"] == "jsonl"
