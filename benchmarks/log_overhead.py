"""Host time of Lightning's ``self.log`` per call, inside a training step that costs next to nothing.

    python benchmarks/log_overhead.py                  # 0, 1 and 4 logged values per step, 2,000 steps each
    python benchmarks/log_overhead.py --device cuda    # the same with the values on the GPU

Under CUDA graphs a step's GPU work is a few milliseconds, and what the host does per step decides the rate.
Each ``self.log`` call costs host time (Lightning moves its record of the value to the value's device at every
call), so the training steps of ``lit_icl`` log only on the steps whose values the loggers write
(:attr:`lit_icl.core.module.ICLModule.logging_step`). This prints milliseconds per step of a one-layer net
with ``n`` values logged at every step, and the cost of one call.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader


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


def ms_per_step(n: int, steps: int, device: str) -> float:
    data = [torch.randn(4, 2) for _ in range(steps)]
    trainer = Trainer(accelerator=device, devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=50)
    start = time.perf_counter()
    trainer.fit(_Logs(n), DataLoader(data, batch_size=None))
    return 1000 * (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--counts", default="0,1,4", help="values logged per step, comma-separated")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")  # Lightning's notes on workers and loggers
    counts = [int(c) for c in args.counts.split(",")]
    ms_per_step(0, 50, args.device)  # warm-up: imports, first allocations
    times = {n: ms_per_step(n, args.steps, args.device) for n in counts}
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steps")
    for n, ms in times.items():
        print(f"{n} values logged per step: {ms:.3f} ms per step")
    if 0 in times and len(times) > 1:
        per_call = [(ms - times[0]) / n for n, ms in times.items() if n]
        print(f"one self.log call: {sum(per_call) / len(per_call):.3f} ms of host time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
