"""Shared fixtures and helpers of the whole suite (a paper's own, e.g. IC-SSL's ``tiny_args``, live in
tests/<paper>/helpers.py)."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest
import torch
from lightning.pytorch import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# In-process tests use one intra-op thread so they do not fight the subprocesses some tests start. Nothing is
# put into the environment: subprocesses run with the default thread count, as a user's run does.
torch.set_num_threads(1)


@pytest.fixture
def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch: pytest.MonkeyPatch, repo_root: str) -> None:
    monkeypatch.chdir(repo_root)


#: torch's compile configs. Deleting one of their entries hides it from every later compile in the process, and
#: pytest's monkeypatch (from pytest 9.2) undoes a ``setattr`` on them by deleting; torch's ``config.patch`` does not.
_TORCH_CONFIGS = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Fails the test that hid a compile setting (checked once its fixtures, monkeypatch's included, are undone),
    instead of every compiling test after it."""
    result = yield
    # Keys of nested settings carry their own dots (inductor's "cpp.enable_kernel_profile"): keep the entries.
    hidden = {f"{name}.{key}": entry for name in _TORCH_CONFIGS if (config := sys.modules.get(name)) is not None
              for key, entry in getattr(config, "_config", {}).items() if getattr(entry, "hide", False)}
    if hidden:
        for entry in hidden.values():  # shown again, so that the tests after this one run as they would alone
            entry.hide = False
        pytest.fail(f"{item.nodeid} hid {sorted(hidden)}: patch torch's configs with their own config.patch, "
                    "not monkeypatch")
    return result


class CrashAtEpoch(Callback):
    """Simulates a crash: raises at the start of epoch ``epoch``, after the previous epoch's checkpoint."""

    def __init__(self, epoch: int = 1):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("simulated crash")


class RecordBatches(Callback):
    """Debug aid: appends (epoch, global_step, batch checksum, lr) lines to ``path``."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        with open(self.path, "a") as fh:
            fh.write(f"{trainer.current_epoch} {trainer.global_step} {float(batch['x'].sum()):.6f} {lr:.8f}\n")



def tb_scalars(run_dir: Path) -> dict[str, list[float]]:
    """Every scalar a run logged to TensorBoard: ``{tag: [values in step order]}``."""
    out: dict[str, list[float]] = {}
    for path in sorted(glob.glob(str(Path(run_dir) / "events.out.tfevents.*"))):
        ea = EventAccumulator(path)
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in ea.Scalars(tag))
    return out


def tb_scalar_steps(run_dir: Path, prefix: str) -> dict[str, list[int]]:
    """``{tag: [steps]}`` of the TensorBoard scalars under ``prefix`` in ``run_dir``, and ``"images"`` for images."""
    steps: dict[str, list[int]] = {}
    for path in sorted(glob.glob(str(Path(run_dir) / "events.out.tfevents.*"))):
        ea = EventAccumulator(path)
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            if tag.startswith(prefix):
                steps.setdefault(tag, []).extend(e.step for e in ea.Scalars(tag))
        for tag in ea.Tags()["images"]:
            steps.setdefault("images", []).extend(e.step for e in ea.Images(tag))
    return steps


def config_args(config: str | Sequence[str]) -> list[str]:
    """``--config`` once per file, base first, overlays after it in order (LightningCLI merges them)."""
    return [arg for path in ((config,) if isinstance(config, str) else config) for arg in ("--config", path)]


def quiet_run_args(tmp_path: Path, config: str | Sequence[str], name: str = "tiny") -> list[str]:
    """The configs, logging under ``tmp_path / "runs" / name``, without progress bar, summary or sanity check."""
    return [
        *config_args(config),
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.logger.init_args.name", name,
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.num_sanity_val_steps", "0",
    ]


def copy_runs(root: Path, tmp_path: Path) -> None:
    """Copy the ``runs`` folder of a fit shared by several tests (a module fixture's ``root``) into ``tmp_path``,
    for a test that writes into the run; the shared fit itself is only read."""
    import shutil

    shutil.copytree(root / "runs", tmp_path / "runs")


def load_script(path: Path) -> ModuleType:
    """Import a script that is not in a package (``experiments/*.py``) as a module named after its file."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module
