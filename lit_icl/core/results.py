"""One results format for every paper: tidy rows, written with their provenance by shared code.

A ``test`` run's folder gets

- ``results.json``: ``{"meta": {...}, "rows": [...]}``. ``meta`` holds the resolved config, the checkpoint
  path, the checkpoint's trained steps, the seeds, the versions of Python, torch, lightning and lit_icl, the
  command, the git commit of the code (and whether it was ``dirty``) and the machine (:func:`provenance`).
  ``rows`` is tidy: each row is one number, ``{"metric", "value", "split", "method", <coordinates>}``, where
  coordinates are the experiment's axes (``label_ratio``, ``n_context``, ``evaluator``, ``depth``, ...);
- ``results.csv``: the same rows, one column per key;
- one PNG per figure of the module's :meth:`~lit_icl.core.module.ICLModule.test_figures`; the same pixels are
  logged to TensorBoard as an image (each figure is drawn once, :func:`lit_icl.core.figures.render`).

Modules build rows with :func:`result_row` in ``on_test_epoch_end``; :class:`ResultsWriter` (always added by the
CLI) writes them at ``on_test_end`` on rank 0. ``python -m lit_icl.report`` reads the rows of any paper's runs.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor

from lit_icl.core.figures import render, save_png

#: Keys every row has, in CSV column order; any other key is a coordinate.
ROW_KEYS = ("metric", "value", "split", "method")
_SCALAR = (str, int, float, bool, type(None))


def result_row(metric: str, value: float, *, method: str, split: str = "test", **coordinates: Any) -> dict[str, Any]:
    """One tidy row: a single number and the coordinates that identify it.

    Args:
        metric: what was measured, e.g. ``accuracy``, ``mse``, ``icl_error``.
        value: the number (a tensor with one element is accepted).
        method: the model or baseline that produced it, e.g. ``ORIG+E2E-ICL``, ``least_squares``.
        split: the data split, ``test`` unless stated.
        coordinates: the experiment's axes, JSON scalars only (``label_ratio=0.25``, ``evaluator="icl"``).
    """
    if not metric or not isinstance(metric, str):
        raise ValueError(f"a result row needs a metric name, got {metric!r}")
    bad = {k: type(v).__name__ for k, v in coordinates.items() if not isinstance(v, _SCALAR)}
    if bad:
        raise ValueError(f"coordinates must be JSON scalars; got {bad}")
    number = float(value.item() if hasattr(value, "item") else value)
    return {"metric": metric, "value": number, "split": split, "method": str(method), **coordinates}


def csv_columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """``metric, value, split, method`` followed by the coordinates in order of first appearance."""
    extra: dict[str, None] = {}
    for row in rows:
        for key in row:
            if key not in ROW_KEYS:
                extra.setdefault(key, None)
    return [*ROW_KEYS, *extra]


def versions() -> dict[str, str]:
    """Versions of what produced a result."""
    import lightning
    import torch

    import lit_icl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "lit_icl": lit_icl.__version__,
    }


def provenance() -> dict[str, Any]:
    """What a result needs to be traced back to beyond versions (lit_icl's version does not change between
    commits): the command line, the commit of the code that ran (``None`` outside a git checkout; ``dirty`` when
    tracked files had changed) and the machine."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                                  check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "__main__.py":  # `python -m lit_icl ...` as typed, not the file's full path
        argv[:1] = ["-m", Path(argv[0]).parent.name]
    # Only lit_icl's own checkout: an installed copy under site-packages may sit inside some other repository.
    commit = git("rev-parse", "HEAD") if (root / ".git").exists() else None
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "command": shlex.join([Path(sys.executable).name, *argv]) if argv and argv[0] else None,
        "commit": commit,
        "dirty": bool(status) if status is not None else None,
        "machine": {
            "host": platform.node(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        },
    }


def run_meta(trainer: Trainer, module: LightningModule, log_dir: str | Path | None = None) -> dict[str, Any]:
    """Provenance of a test run: config, checkpoint, trained steps, seeds, versions, time.

    ``log_dir``: the run folder, if the caller has it; otherwise ``trainer.log_dir`` is asked, which under DDP is a
    broadcast from rank 0 and so must then be called on every rank.
    """
    if log_dir is None:
        log_dir = trainer.log_dir
    log_dir = Path(log_dir) if log_dir else None
    config = None
    if log_dir is not None and (log_dir / "config.yaml").is_file():
        # Written by the CLI's SaveConfigCallback at setup: the fully resolved config of this run.
        config = yaml.safe_load((log_dir / "config.yaml").read_text())
    if config is None:
        dm = trainer.datamodule
        config = {
            "model": {"class_path": _qualname(module), "init_args": _jsonable(dict(module.hparams))},
            "data": None if dm is None else {"class_path": _qualname(dm), "init_args": _jsonable(dict(dm.hparams))},
        }
    dm_hparams = getattr(trainer.datamodule, "hparams", {}) if trainer.datamodule is not None else {}
    seed = os.environ.get("PL_GLOBAL_SEED")
    return {
        "config": _jsonable(config),
        "checkpoint": str(trainer.ckpt_path) if trainer.ckpt_path else None,
        "trained_steps": int(getattr(module, "trained_steps", module.global_step)),
        # How the checkpoint's run ended (early-stopping rule, best step, stopped step), when it recorded that.
        "stopping": stopping_record(trainer.ckpt_path),
        # The config of the fit that wrote the checkpoint (its training data and length), when it is beside it.
        "fit_config": fit_config(trainer.ckpt_path),
        "seeds": {
            "seed_everything": int(seed) if seed is not None else None,
            "data_seed": dm_hparams.get("data_seed"),
        },
        "versions": versions(),
        # Without these a results.json could not say which code, command and machine made it.
        **provenance(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


#: What :class:`lit_icl.callbacks.StopWhenConverged` writes into a run folder at the end of ``fit``.
STOPPING_FILE = "stopping.json"


def stopping_record(ckpt_path: str | Path | None) -> dict[str, Any] | None:
    """The ``stopping.json`` of the run that wrote ``<run>/checkpoints/<file>.ckpt`` (``None`` if it has none):
    how that run's training ended under the early-stopping rule."""
    if not ckpt_path:
        return None
    path = Path(ckpt_path).resolve().parent.parent / STOPPING_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def fit_config(ckpt_path: str | Path | None) -> dict[str, Any] | None:
    """The ``config.yaml`` of the CLI run that wrote ``<run>/checkpoints/<file>.ckpt`` (``None`` without one): what
    the tested model was trained on, which the test run's own config does not say (tests of models trained on other
    data, or for other lengths, are other experiments to :mod:`lit_icl.report`)."""
    if not ckpt_path:
        return None
    path = Path(ckpt_path).resolve().parent.parent / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None
    return _jsonable(config) if isinstance(config, dict) else None


def write_results(
    out_dir: str | Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], figures: Mapping[str, Any] = ()
) -> Path:
    """Write ``results.json``, ``results.csv`` and ``<name>.png`` per figure into ``out_dir``; return the JSON path.

    A figure is a matplotlib ``Figure`` or its pixels from :func:`lit_icl.core.figures.render` (drawn already).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": dict(meta), "rows": [dict(r) for r in rows]}
    path = out / "results.json"
    path.write_text(json.dumps(payload, indent=2, allow_nan=True))
    columns = csv_columns(rows)
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    for name, fig in dict(figures).items():
        save_png(fig, out / f"{name}.png")
    return path


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a ``results.json`` (or the one inside a run folder) and check its shape."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found; pass a run folder written by `python -m lit_icl test`")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{p} is not a results.json ({err}); pass a run folder written by `python -m lit_icl test` "
                         "or its results.json (a grid's tidy CSV is read by its driver: report --out FILE.csv)") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or "meta" not in data:
        raise ValueError(f"{p} is not a lit_icl results file (expected {{'meta': ..., 'rows': [...]}})")
    for row in data["rows"]:
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{p}: a row lacks {missing}: {row}")
    return data


def collect_test_rows(trainer: Trainer, module: LightningModule) -> list[dict[str, Any]]:
    """The rows of a ``test`` run: the module's ``test_rows``, then those of every callback that measures
    something itself (a callback with a ``test_rows`` list, e.g. a diagnostic over the net's layers)."""
    rows = list(getattr(module, "test_rows", None) or [])
    for callback in trainer.callbacks:
        extra = getattr(callback, "test_rows", None)
        if isinstance(extra, list):
            rows.extend(extra)
    return rows


def trained_step_x(pl_module: LightningModule) -> int:
    """The TensorBoard step of an evaluation of the current weights: where the fit that trained them wrote its
    validation round after its last step (``trained_steps - 1``; 0 for untrained weights)."""
    return max(int(getattr(pl_module, "trained_steps", pl_module.global_step)) - 1, 0)


class ResultsWriter(Callback):
    """Writes a ``test`` run's rows, provenance and figures next to its logs (rank 0).

    Reads the rows of :func:`collect_test_rows` (the module's ``test_rows``, set in ``on_test_epoch_end``, and any
    callback's) and draws ``pl_module.test_figures(rows)`` from all of them. The CLI adds this callback to every
    run; in Python add it to the ``Trainer``'s callbacks.

    Args:
        dirpath: where to write; default the trainer's ``log_dir`` (the run folder).
    """

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath
        #: Path of the last ``results.json`` written (for callers and tests).
        self.last_path: Path | None = None

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rows = collect_test_rows(trainer, pl_module)
        # trainer.log_dir is a broadcast from rank 0 under DDP: every rank asks for it here, before the rank-0
        # check, or rank 0 would wait forever for ranks that have already returned.
        log_dir = trainer.log_dir
        if not trainer.is_global_zero or not rows:
            return
        figure_fn = getattr(pl_module, "test_figures", None)
        figures = dict(figure_fn(rows)) if callable(figure_fn) else {}
        if trainer.fast_dev_run and self.dirpath is None:
            # fast_dev_run turns logging off: the rows and figures are made (so the check covers them) but not
            # written into the working folder, which is where they would land without a run folder.
            rank_zero_info(f"fast_dev_run: {len(rows)} result rows and {len(figures)} figures made, not written")
            return
        out_dir = self.dirpath or log_dir or trainer.default_root_dir
        # Drawn once: the PNG and TensorBoard get the same pixels (drawing is a large share of a small test run).
        images = {name: render(fig) for name, fig in figures.items()}
        self.last_path = write_results(out_dir, rows, run_meta(trainer, pl_module, log_dir), images)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                for name, pixels in images.items():
                    logger.experiment.add_image(f"test/{name}", pixels[..., :3], trained_step_x(pl_module),
                                                dataformats="HWC")
                logger.experiment.flush()


class PredictionsWriter(BasePredictionWriter):
    """Writes a ``predict`` run's outputs (``predict_step``'s per batch, on the CPU) to ``predictions.pt`` in
    the run folder, with the run's provenance; under DDP each rank writes ``predictions_rank<r>.pt`` with the
    indices of the items it predicted. The CLI adds it to ``predict``; Lightning alone would keep the outputs in
    memory and let the process end without them.

    Read with ``torch.load(path, weights_only=True)``: ``{"predictions": [per batch], "batch_indices": ...,
    "meta": ...}`` (a list per dataloader when there are several).
    """

    def __init__(self, dirpath: str | None = None):
        super().__init__(write_interval="epoch")
        self.dirpath = dirpath
        #: Path of the last file written (for callers and tests).
        self.last_path: Path | None = None

    def write_on_epoch_end(self, trainer: Trainer, pl_module: LightningModule, predictions: Sequence[Any],
                           batch_indices: Sequence[Any]) -> None:
        log_dir = trainer.log_dir  # a broadcast under DDP: every rank asks (see ResultsWriter)
        if trainer.fast_dev_run and self.dirpath is None:
            rank_zero_info(f"fast_dev_run: {len(predictions)} batches predicted, not written")
            return
        out_dir = Path(self.dirpath or log_dir or trainer.default_root_dir)
        name = "predictions.pt" if trainer.world_size == 1 else f"predictions_rank{trainer.global_rank}.pt"
        path = out_dir / name
        out_dir.mkdir(parents=True, exist_ok=True)
        payload = {
            "predictions": apply_to_collection(list(predictions), Tensor, lambda x: x.detach().cpu()),
            "batch_indices": list(batch_indices),
            # Plain JSON types (a str subclass such as torch's version would need weights_only=False to load).
            "meta": json.loads(json.dumps(_jsonable(run_meta(trainer, pl_module, log_dir)))),
        }
        partial = path.with_name(f".{name}.partial")  # renamed when complete: a crash leaves no half file
        torch.save(payload, partial)
        partial.replace(path)
        self.last_path = path
        print(f"predictions: {path}", flush=True)


def _qualname(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _jsonable(value: Any) -> Any:
    """Config values as JSON: containers recursively, scalars as they are, anything else as its ``str``."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, _SCALAR):
        return value
    return str(value)
