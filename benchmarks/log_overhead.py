"""Host time of Lightning's per-step bookkeeping: a ``self.log`` call, and the progress bar's update.

    python benchmarks/log_overhead.py                  # 0, 1 and 4 logged values per step; each progress bar
    python benchmarks/log_overhead.py --device cuda    # the same with the values on the GPU

Under CUDA graphs a step's GPU work is a few milliseconds, and what the host does per step decides the rate.
Each ``self.log`` call costs host time (Lightning moves its record of the value to the value's device at every
call), so the training steps of ``lit_icl`` log only on the steps whose values the loggers write
(:attr:`lit_icl.core.module.ICLModule.logging_step`). Lightning's default progress bars update at every
batch; on an accelerator the CLI makes them wait for logging steps (:func:`lit_icl.cli.trainer_setup.
quiet_progress_bar`). This prints milliseconds per step of a one-layer net with ``n`` values logged at every
step and the cost of one call, then with each progress bar (one value logged every 50 steps, shown in the bar).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
import warnings
from collections.abc import Callable

import torch
from bench_options import at_least
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from torch import nn
from torch.utils.data import DataLoader

from lit_icl.cli.trainer_setup import LoggingStepsRichBar


class _Bar(LightningModule):
    """A one-layer net that shows its loss in the progress bar on every 50th step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.net(batch).pow(2).mean()
        if batch_idx % 50 == 49:
            self.log("loss", loss.detach(), prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Logs(LightningModule):
    """A one-layer net whose training step logs its loss ``n`` times under ``n`` names."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)
        self.n = n

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.net(batch).pow(2).mean()
        for k in range(self.n):
            self.log(f"train/value{k}", loss.detach())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def ms_per_step(module: LightningModule, steps: int, device: str, bar: Callback | None = None) -> float:
    data = [torch.randn(4, 2) for _ in range(steps)]
    trainer = Trainer(accelerator=device, devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=bar is not None, callbacks=[bar] if bar is not None else [],
                      enable_model_summary=False, log_every_n_steps=50)
    start = time.perf_counter()
    trainer.fit(module, DataLoader(data, batch_size=None))
    return 1000 * (time.perf_counter() - start) / steps


def bars() -> dict[str, Callable[[], Callback | None]]:
    """The progress bars timed: none, tqdm's and Rich's as Lightning makes them, and as the CLI makes them on an
    accelerator (Rich's only where ``rich`` is installed)."""
    choices: dict[str, Callable[[], Callback | None]] = {
        "none": lambda: None, "tqdm (Lightning's)": TQDMProgressBar,
        "tqdm every 50 steps (the CLI's on a GPU)": lambda: TQDMProgressBar(refresh_rate=50),
    }
    if importlib.util.find_spec("rich") is not None:
        choices["rich (Lightning's)"] = RichProgressBar
        choices["rich on logging steps (the CLI's on a GPU)"] = LoggingStepsRichBar
    return choices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--steps", type=at_least(1), default=2000)
    parser.add_argument("--counts", default="0,1,4", help="values logged per step, comma-separated")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")  # Lightning's notes on workers and loggers
    counts = [int(c) for c in args.counts.split(",")]
    ms_per_step(_Logs(0), 50, args.device)  # warm-up: imports, first allocations
    times = {n: ms_per_step(_Logs(n), args.steps, args.device) for n in counts}
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steps")
    for n, ms in times.items():
        print(f"{n} values logged per step: {ms:.3f} ms per step")
    if 0 in times and len(times) > 1:
        per_call = [(ms - times[0]) / n for n, ms in times.items() if n]
        print(f"one self.log call: {sum(per_call) / len(per_call):.3f} ms of host time")
    # The bars draw to the terminal while they run: their times are printed after all of them.
    bar_times = {name: ms_per_step(_Bar(), args.steps, args.device, bar()) for name, bar in bars().items()}
    for name, ms in bar_times.items():
        print(f"progress bar {name}: {ms:.3f} ms per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
