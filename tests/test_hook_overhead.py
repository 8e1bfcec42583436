"""Lightning's per-hook bookkeeping made cheap, with nothing it does changed: the CLI's no-op profiler
(lit_icl/cli/trainer_setup.py), ``ICLModule``'s direct store of the running hook's name (lit_icl/core/module.py)
and ``RunCheckpoint``'s cached state key (lit_icl/callbacks/checkpoint.py). ``benchmarks/loop_overhead.py``
measures what they save."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.profilers import PassThroughProfiler, Profiler, SimpleProfiler
from torch import nn
from torch.utils.data import DataLoader

from lit_icl.callbacks.checkpoint import RunCheckpoint
from lit_icl.cli import LitICLCLI
from lit_icl.cli.trainer_setup import NoOpProfiler, no_op_profiler
from lit_icl.core.module import ICLModule

# In the order Lightning calls them in a step (its closure zeroes the gradients after the forward, before backward).
_HOOKS = ("on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
          "on_before_optimizer_step", "on_train_batch_end")


class _Tiny(ICLModule):
    """Records the hook name Lightning has set whenever its own code runs, and logs from its step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.seen: list[Any] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(self._current_fx_name)
        loss = self.net(batch).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        self.seen.append(self._current_fx_name)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _HookLog(Callback):
    """Each callback hook of a training step, with the hook name the module carried while it ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        for hook in _HOOKS:
            setattr(self, hook, self._recorder(hook))

    def _recorder(self, hook: str):
        def record(trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
            self.calls.append((hook, pl_module._current_fx_name))
        return record


def _fit(profiler: Profiler, tmp_path) -> tuple[_Tiny, _HookLog, Trainer]:
    seed_everything(0)
    module, log = _Tiny(), _HookLog()
    batches = [torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                      callbacks=[log], profiler=profiler, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few batches, no workers
        trainer.fit(module, DataLoader(batches, batch_size=None))
    return module, log, trainer


def test_the_no_op_profiler_and_the_direct_hook_name_change_nothing_a_run_does(tmp_path) -> None:
    plain, plain_log, plain_trainer = _fit(PassThroughProfiler(), tmp_path / "a")
    quick, quick_log, quick_trainer = _fit(NoOpProfiler(), tmp_path / "b")
    for a, b in zip(plain.parameters(), quick.parameters(), strict=True):
        assert torch.equal(a, b)
    # Every hook ran, in the same order, and saw the name Lightning set for it.
    assert quick_log.calls == plain_log.calls
    assert [hook for hook, _ in quick_log.calls[:6]] == list(_HOOKS)
    assert all(name == hook for hook, name in quick_log.calls)
    assert quick.seen == plain.seen == ["training_step", "on_before_zero_grad"] * 6
    assert quick_trainer.callback_metrics["train/loss"] == plain_trainer.callback_metrics["train/loss"]


def test_the_no_op_context_runs_its_body_and_lets_errors_through() -> None:
    profiler, ran = NoOpProfiler(), []
    with profiler.profile("[Callback]x.on_train_batch_end"):
        ran.append(True)
    assert ran == [True]
    with pytest.raises(ValueError, match="from the body"), profiler.profile("training_step"):
        raise ValueError("from the body")
    assert profiler.summary() == ""  # records nothing, as Lightning's default profiler


def _cli_trainer(tmp_path, *extra: str) -> Trainer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = LitICLCLI(LightningModule, LightningDataModule, run=False, args=[
            "--config", "configs/mmca/synthetic.yaml", "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false", *extra])
    return cli.trainer


def test_the_cli_gives_a_run_the_no_op_profiler_and_keeps_a_named_one(tmp_path) -> None:
    assert type(_cli_trainer(tmp_path / "a").profiler) is NoOpProfiler
    assert type(_cli_trainer(tmp_path / "b", "--trainer.profiler", "simple").profiler) is SimpleProfiler
    named = Trainer(accelerator="cpu", profiler=SimpleProfiler(), logger=False)
    no_op_profiler(named)
    assert type(named.profiler) is SimpleProfiler


def test_iclmodule_stores_the_hook_name_where_nn_module_would_and_registers_the_rest() -> None:
    module, reference = _Tiny(), nn.Module()
    for target in (module, reference):
        target._current_fx_name = "on_train_batch_start"
        target.extra = nn.Linear(1, 1)
        target.scale = nn.Parameter(torch.ones(()))
        target.register_buffer("count", torch.zeros(()))
        target.count = torch.ones(())
    for target in (module, reference):
        assert target.__dict__["_current_fx_name"] == "on_train_batch_start"
        assert "_current_fx_name" not in {*target._parameters, *target._buffers, *target._modules}
        assert "extra" in target._modules and "scale" in target._parameters
        assert torch.equal(target._buffers["count"], torch.ones(()))
    assert {n for n, _ in module.named_parameters()} == {"net.weight", "net.bias", "extra.weight", "extra.bias",
                                                          "scale"}


def test_run_checkpoints_state_key_is_model_checkpoints_and_follows_its_settings(tmp_path) -> None:
    kwargs = {"dirpath": tmp_path, "monitor": "val/acc", "mode": "max", "every_n_epochs": 2}
    ours, lightnings = RunCheckpoint(**kwargs), ModelCheckpoint(**kwargs)
    assert ours.state_key == lightnings.state_key
    assert ours.state_key == lightnings.state_key  # the cached key
    ours.monitor = lightnings.monitor = "val/loss"
    ours.mode = lightnings.mode = "min"
    assert ours.state_key == lightnings.state_key
    assert "val/loss" in ours.state_key
