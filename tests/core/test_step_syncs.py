"""A training step that the GPU never waits on: what each step logs stays on the device until a logging step.

Lightning turns every value logged with ``prog_bar=True`` into a Python number after every batch, whether or not a
bar is shown; :meth:`lit_icl.core.module.ICLModule.log_loss` hands the bar a host copy on logging steps only. On
the CPU the tests check that behaviour (which step's loss the bar shows, that the logged series is every step's
loss) and run each paper's tiny config with :class:`~lit_icl.callbacks.HostReadCensus` in strict mode, which
fails at the first step that reads a device value on the host; on a GPU (marked ``cuda``) each paper's step runs
with CUDA's sync check turned to errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from coqe.omniglot.helpers import TRANSFORMER, coqe_args
from coqe.regression.helpers import reg_args
from icssl.helpers import tiny_args
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import Logger
from mmca.synthetic.helpers import mmca_args
from torch import nn
from torch.utils.data import DataLoader

from lit_icl.callbacks import HostReadCensus
from lit_icl.callbacks.host_reads import HostReadInStep
from lit_icl.cli import main
from lit_icl.core.module import ICLModule


class _Regression(ICLModule):
    """One linear layer on fixed batches; logs its loss through ``log_loss``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.losses: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = (self.net(x) - y).pow(2).mean()
        self.losses.append(float(loss.detach()))
        self.log_loss("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Bar(Callback):
    """What the progress bar holds after each batch."""

    def __init__(self) -> None:
        self.shown: list[float | None] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        value = trainer.progress_bar_metrics.get("loss")
        self.shown.append(None if value is None else float(value))


class _Written(Logger):
    """A logger that keeps what Lightning writes: ``{step: {name: value}}``."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: dict[int, dict[str, float]] = {}

    @property
    def name(self) -> str:
        return "written"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.steps.setdefault(int(step), {}).update(metrics)


def _fit(tmp_path: Path, progress_bar: bool) -> tuple[_Regression, _Bar, _Written]:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)) for _ in range(10)]
    module, bar, written = _Regression(), _Bar(), _Written()
    trainer = Trainer(accelerator="cpu", max_steps=10, log_every_n_steps=4, enable_progress_bar=progress_bar,
                      enable_checkpointing=False, enable_model_summary=False, logger=written, callbacks=[bar],
                      default_root_dir=tmp_path)
    trainer.fit(module, DataLoader(batches, batch_size=None))
    return module, bar, written


def test_the_progress_bar_shows_the_loss_of_the_first_and_the_logging_steps(tmp_path) -> None:
    """With ``log_every_n_steps=4`` the bar shows step 0's loss until step 3, then step 3's until step 7."""
    module, bar, written = _fit(tmp_path, progress_bar=True)
    losses = module.losses
    expected = [losses[0]] * 3 + [losses[3]] * 4 + [losses[7]] * 3
    assert bar.shown == pytest.approx(expected, rel=1e-6)
    assert len(set(losses)) == len(losses)  # the steps differ, so the bar really skipped steps
    # The logger writes the loss of each logging step, under its own name, and nothing of the bar's.
    assert {step: values["train/loss"] for step, values in written.steps.items()} == pytest.approx(
        {3: losses[3], 7: losses[7]}, rel=1e-6)
    assert not any("loss" in values for values in written.steps.values())


def test_without_a_progress_bar_nothing_is_copied_for_it(tmp_path) -> None:
    module, bar, written = _fit(tmp_path, progress_bar=False)
    assert bar.shown == [None] * 10
    assert {step: values["train/loss"] for step, values in written.steps.items()} == pytest.approx(
        {3: module.losses[3], 7: module.losses[7]}, rel=1e-6)


class _TwoOptimizers(ICLModule):
    """Manual optimization with two optimizers, as I2CL calibrates several methods: two steps per batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.nets = nn.ModuleList([nn.Linear(3, 1), nn.Linear(3, 1)])
        self.losses: dict[int, list[float]] = {0: [], 1: []}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        for k, opt in enumerate(self.optimizers()):
            opt.zero_grad()
            loss = (self.nets[k](x) - y).pow(2).mean()
            self.manual_backward(loss)
            opt.step()
            self.losses[k].append(float(loss.detach()))
            self.log_loss(f"train/loss/{k}", loss.detach())

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.SGD(net.parameters(), lr=0.1) for net in self.nets]


def test_logging_steps_count_batches_not_optimizer_steps(tmp_path) -> None:
    """With two optimizer steps per batch, the loss of each is written at batches 3 and 7 (every 4 batches):
    ``logging_step`` is Lightning's own decision, which counts batches."""
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)) for _ in range(10)]
    module, written = _TwoOptimizers(), _Written()
    Trainer(accelerator="cpu", max_epochs=1, log_every_n_steps=4, enable_progress_bar=False,
            enable_checkpointing=False, enable_model_summary=False, logger=written,
            default_root_dir=tmp_path).fit(module, DataLoader(batches, batch_size=None))
    assert set(written.steps) == {3, 7}
    for step in (3, 7):
        for k in (0, 1):
            assert written.steps[step][f"train/loss/{k}"] == pytest.approx(module.losses[k][step], rel=1e-6)


def _no_waits(tmp_path: Path, run: str) -> list[str]:
    """A tiny run of ``run`` on the GPU, 8 steps in one epoch, none of them logging steps, with the bar shown."""
    common = ["--trainer.accelerator", "gpu", "--compile.mode", "off", "--trainer.max_steps", "8",
              "--trainer.log_every_n_steps", "50",
              "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "true",
              "--data.init_args.train_batches_per_epoch", "10"]
    callbacks = ['[{"class_path": "subprocess_callbacks.NoDeviceWaits"}]']
    if run == "icssl":
        return [*tiny_args(tmp_path), *common, "--trainer.max_epochs", "-1", "--trainer.callbacks", *callbacks]
    if run == "coqe_regression":  # prompts drawn on the GPU from seeds read before the transfer
        return [*reg_args(tmp_path), *common, "--trainer.callbacks", *callbacks]
    if run.startswith("mmca"):  # the fixed training set gathered on the GPU from chunk keys, or fresh prompts drawn
        fresh = ["--data.init_args.train_prompts", "null"] if run == "mmca_fresh" else []
        return [*mmca_args(tmp_path), *common, *fresh, "--trainer.max_epochs", "-1", "--trainer.callbacks", *callbacks]
    return [*coqe_args(tmp_path), *common, "--trainer.callbacks", *callbacks]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_suite.py runs it)")
@pytest.mark.parametrize("run", ["icssl", "coqe_omniglot", "coqe_regression", "mmca_synthetic", "mmca_fresh"])
def test_training_steps_never_wait_for_the_gpu(tmp_path, run) -> None:
    """From the end of batch 2 to the end of batch 6 any device sync raises, and so does a copy from pageable host
    memory: the batch transfer (pinned by the loader), CoQE's image gather and noise, CoQE regression's prompt
    drawing, mmca's gather of its fixed training set or drawing of fresh prompts, the step, and Lightning's
    per-batch bookkeeping all queue work without reading it back."""
    main(["fit", *_no_waits(tmp_path, run)])
    assert list((tmp_path / "runs").rglob("last.ckpt"))


# ------------------------------------------------------------------ the same on the CPU: a census of host reads
def _census_args(tmp_path: Path, run: str) -> list[str]:
    """A tiny CPU run of ``run``: 6 steps, none a logging step, each counted by a strict census."""
    common = ["--trainer.max_steps", "6", "--trainer.log_every_n_steps", "50", "--trainer.limit_val_batches", "0",
              "--trainer.callbacks+=lit_icl.callbacks.HostReadCensus", "--trainer.callbacks.strict", "true",
              "--trainer.callbacks.sites", "true"]
    if run == "icssl":
        return [*tiny_args(tmp_path), "--trainer.max_epochs", "-1", *common]
    if run == "coqe_regression":
        return [*reg_args(tmp_path), *common]
    if run == "mmca_synthetic":
        return [*mmca_args(tmp_path), "--trainer.max_epochs", "-1", *common]
    if run == "coqe_transformer":
        return [*coqe_args(tmp_path, config=TRANSFORMER), *common]
    return [*coqe_args(tmp_path), *common]


@pytest.mark.parametrize("run", ["icssl", "coqe_omniglot", "coqe_transformer", "coqe_regression", "mmca_synthetic"])
def test_no_training_step_reads_a_device_value_on_the_host(tmp_path, run) -> None:
    """Each paper's step, the update, the callbacks the CLI adds and Lightning's per-batch bookkeeping, with the
    project's CUDA branches (fused Adam, the loss check deferred): a read in any of the 5 counted steps raises
    HostReadInStep, naming where it was made."""
    main(["fit", *_census_args(tmp_path, run)])
    assert list((tmp_path / "runs").rglob("last.ckpt"))


class _ReadsItsLoss(_Regression):
    """Reads its loss on the host at every step, as ``float(loss)`` in a training step does."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.last_loss = loss.item()
        return loss


def _census_fit(tmp_path: Path, module: ICLModule, census: HostReadCensus) -> None:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)) for _ in range(8)]
    Trainer(accelerator="cpu", max_steps=8, log_every_n_steps=4, enable_progress_bar=False,
            enable_checkpointing=False, enable_model_summary=False, logger=_Written(), callbacks=[census],
            default_root_dir=tmp_path).fit(module, DataLoader(batches, batch_size=None))


def test_a_step_that_reads_on_the_host_fails_a_strict_census_with_the_line_that_read(tmp_path) -> None:
    """...and the failed run leaves nothing patched (Lightning skips teardown when a run fails)."""
    one_hot, tolist = F.one_hot, torch.Tensor.tolist
    with pytest.raises(HostReadInStep, match=r"training step 1 read device values on the host \(aten\._local_scalar_dense"
                       r" at tests/core/test_step_syncs\.py:\d+ in training_step"):
        _census_fit(tmp_path, _ReadsItsLoss(), HostReadCensus(warmup=1, strict=True, sites=True))
    assert F.one_hot is one_hot and torch.Tensor.tolist is tolist


def test_the_census_counts_the_reads_of_logging_steps_and_none_elsewhere(tmp_path) -> None:
    """Steps 0-7 with a log interval of 4: 3 and 7 write the logged loss (Lightning reads it then); the loss
    module's own 8 ``float(loss)`` reads are the test's (``_Regression`` keeps a host copy of every loss)."""
    census = HostReadCensus(warmup=0)
    _census_fit(tmp_path, _Regression(), census)
    means = census.means()
    assert means["step"][2] == 6 and means["logging step"][2] == 2 and means["update"][2] == 8
    # _Regression reads each loss with float(...): one read in every step, and the logging steps read more.
    assert [sum(c.values()) for c in census.windows["step"]] == [1] * 6
    assert all(sum(c.values()) > 1 for c in census.windows["logging step"])
    assert all(not c for c in census.windows["update"])  # SGD's update reads nothing
