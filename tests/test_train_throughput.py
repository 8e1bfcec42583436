"""``benchmarks/train_throughput.py`` times the same work on both paths: from the same weights and the same batches,
its bare loop and its Lightning run end at the same weights, bit for bit (CPU, deterministic kernels)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script
from lightning.pytorch import LightningDataModule, LightningModule

from lit_icl.cli import LitICLCLI, process_defaults

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
MANIFOLDS = str(ROOT / "configs/icssl/manifolds.yaml")
#: The cylinder config at a size that trains a step in milliseconds; the cosine schedule (the config's) is kept,
#: with a warm-up shorter than the run so that both of its phases are stepped through.
TINY = ["--model.init_args.net.init_args.representation.init_args.n_points=20", "--data.init_args.n_points=20",
        "--data.init_args.batch_size=16", "--model.init_args.warmup_steps=2"]


def _script():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # the scripts import their neighbours
    return load_script(BENCHMARKS / "train_throughput.py")


def _template(extra: list[str]) -> tuple[LightningModule, LightningDataModule]:
    process_defaults()
    cli = LitICLCLI(LightningModule, LightningDataModule, run=False,
                    args=["--config", MANIFOLDS, "--trainer.logger", "false", *TINY, *extra])
    return cli.model, cli.datamodule


@pytest.mark.parametrize("extra", [[], ["--model.init_args.lr_schedule=constant"]], ids=["cosine", "constant"])
def test_bare_loop_and_lightning_end_at_the_same_weights(extra) -> None:
    """Seven steps each (two of them warm-up): every parameter equal, and moved from the start. The bare loop used
    to train at the constant ``lr`` while ``ICSSLModule.configure_optimizers`` gives the config's cosine schedule
    (a linear warm-up from ``lr / warmup_steps``), so the two paths trained different weights."""
    script = _script()
    template, dm = _template(extra)
    steps, warmup = 7, 2
    dm.hparams.train_batches_per_epoch = max(dm.hparams.train_batches_per_epoch, steps + 1)
    start = copy.deepcopy(template.net.state_dict())
    lit, bare = copy.deepcopy(template), copy.deepcopy(template)
    cpu = torch.device("cpu")
    try:
        assert script.lightning_steps_per_s(lit, dm, warmup, steps, cpu, True) > 0
        assert script.bare_steps_per_s(bare, dm, warmup, steps, cpu, True) > 0
    finally:
        torch.use_deterministic_algorithms(False)
    lit_weights, bare_weights = lit.net.state_dict(), bare.net.state_dict()
    assert lit_weights.keys() == bare_weights.keys() == start.keys()
    moved = [name for name in start if not torch.equal(start[name], bare_weights[name])]
    assert moved, "the bare loop changed no weight"
    differ = [name for name in start if not torch.equal(lit_weights[name], bare_weights[name])]
    assert not differ, f"{len(differ)} of {len(start)} tensors differ between the paths, e.g. {differ[:3]}"


def test_no_warm_up_times_every_step_from_the_first_batch(monkeypatch) -> None:
    """``--warmup 0`` is allowed: the clocks start before the first batch, on both paths. They used to start at
    the end of step 0, which never came (steps are counted from 1), so both divided by ``perf_counter()`` itself
    and reported about 0 steps/s."""
    script = _script()
    template, dm = _template([])
    dm.hparams.train_batches_per_epoch = max(dm.hparams.train_batches_per_epoch, 4)
    cpu = torch.device("cpu")
    # Each perf_counter() call one second after the one before, starting far from 0 (as the real clock does).
    clock = iter(range(10**6, 2 * 10**6))
    monkeypatch.setattr(script.time, "perf_counter", lambda: float(next(clock)))
    try:
        for run in (script.lightning_steps_per_s, script.bare_steps_per_s):
            rate = run(copy.deepcopy(template), dm, 0, 3, cpu, True)
            assert 3 / 1000 < rate <= 3.0, (run.__name__, rate)
    finally:
        torch.use_deterministic_algorithms(False)
