"""CoQE regression: training steps/s through Lightning vs a bare loop, and our Transformer vs HuggingFace GPT-2.

    python benchmarks/coqe_regression_throughput.py                 # everything, CPU (or GPU when present)
    python benchmarks/coqe_regression_throughput.py --only hf --steps 50 --device cuda
    python benchmarks/coqe_regression_throughput.py --only train --nets coqe

Sections (App. C.1 sizes: width 64, 3 layers, 2 heads; batch 64; linear functions, d = 10, 41 points):

- ``train``: steps/s of CoQE and of the Transformer baseline: a bare PyTorch loop (on-device prompt generation,
  forward, all-prefix MSE, backward, Adam) vs ``Trainer.fit`` with :class:`RegressionDataModule` (no logger,
  checkpoints or validation). Goal (issue 7): Lightning >= 0.95x bare.
- ``hf``: training steps/s of our :class:`RegressionTransformer` vs the same model with its body replaced by a
  HuggingFace ``GPT2Model`` of equal size (as Garg et al. use; ``vocab_size=1`` so its unused token table does not
  count; dropout 0), on the same batches. Goal: ours >= 1.5x HF. ``transformers`` is an optional extra, imported
  here only.

Timings exclude a warm-up of ``--warmup`` steps; each figure is the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_options import at_least
from lightning.pytorch import Callback, Trainer
from torch import Tensor, nn

from lit_icl.coqe.regression.data import RegressionDataModule, sample_prompts
from lit_icl.coqe.regression.module import CoQERegressionModule
from lit_icl.coqe.regression.nets import (
    CoQERegressor,
    RegressionTransformer,
    ReLUEmbedding,
    interleave,
)
from lit_icl.core.nets import count_parameters


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _batch(step: int, device: torch.device, batch: int, n: int, d: int) -> dict[str, Tensor]:
    g = torch.Generator(device=device).manual_seed(step)
    return sample_prompts("linear", batch, n, d, g)


def bench_bare(net: nn.Module, device: torch.device, steps: int, warmup: int, batch: int, n: int, d: int) -> float:
    """Steps/s of a plain loop with the module's objective (prompts drawn on the device, as the data module)."""
    net = net.to(device).train()
    opt = torch.optim.Adam(net.parameters(), lr=5e-5)
    start = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            start = time.perf_counter()
        p = _batch(i, device, batch, n, d)
        loss = ((net(p["xs"], p["ys"]) - p["ys"]) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _sync(device)
    return steps / (time.perf_counter() - start)


class _Timer(Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.end, self.count = warmup, 0.0, 0.0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.count += 1
        if self.count == self.warmup:
            _sync(pl_module.device)
            self.start = time.perf_counter()
        _sync(pl_module.device)
        self.end = time.perf_counter()


def bench_lightning(net: nn.Module, device: torch.device, steps: int, warmup: int, batch: int, n: int, d: int) -> float:
    dm = RegressionDataModule("linear", n_dims=d, n_points=n, batch_size=batch, chunk_size=batch,
                              train_batches_per_epoch=warmup + steps, eval_batch_size=batch, val_prompts=batch,
                              test_prompts=batch)
    model = CoQERegressionModule(net, lr=5e-5)
    timer = _Timer(warmup)
    trainer = Trainer(
        accelerator=device.type, devices=1, max_steps=warmup + steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=[timer],
    )
    trainer.fit(model, datamodule=dm)
    return steps / (timer.end - timer.start)


class HFRegressionTransformer(nn.Module):
    """:class:`RegressionTransformer` with a HuggingFace ``GPT2Model`` body of the same size."""

    def __init__(self, n_dims: int, width: int = 64, depth: int = 3, heads: int = 2, max_points: int = 101):
        super().__init__()
        from transformers import GPT2Config, GPT2Model  # optional extra, benchmark only

        config = GPT2Config(
            vocab_size=1, n_positions=2 * max_points, n_embd=width, n_layer=depth, n_head=heads,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0,
        )
        self.read_in = ReLUEmbedding(n_dims, width)
        self.backbone = GPT2Model(config)
        self.read_out = nn.Linear(width, 1)

    def forward(self, xs: Tensor, ys: Tensor, xq: Tensor | None = None) -> Tensor:
        h = self.backbone(inputs_embeds=self.read_in(interleave(xs, ys))).last_hidden_state
        return self.read_out(h[:, 0::2]).squeeze(-1)


def _median(fn, repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["train", "hf"], default=None)
    parser.add_argument("--steps", type=at_least(1), default=20)
    parser.add_argument("--warmup", type=at_least(0), default=3)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--batch", type=at_least(1), default=64)
    parser.add_argument("--points", type=at_least(1), default=41)
    parser.add_argument("--dims", type=at_least(1), default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--nets", default="all", choices=["all", "transformer", "coqe"])
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    shape = (args.batch, args.points, args.dims)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, batch x points x d = {shape}")
    common = (device, args.steps, args.warmup, args.batch, args.points, args.dims)
    if args.only in (None, "train"):
        for name, make in (("transformer", RegressionTransformer), ("coqe", CoQERegressor)):
            if args.nets not in ("all", name):
                continue
            torch.manual_seed(0)
            net = make(args.dims)
            state = {k: v.clone() for k, v in net.state_dict().items()}
            print(f"{name}: {count_parameters(net) / 1e6:.3f}M parameters")

            def bare(net: nn.Module = net, state: dict = state) -> float:
                net.load_state_dict(state)
                return bench_bare(net, *common)

            def lightning(net: nn.Module = net, state: dict = state) -> float:
                net.load_state_dict(state)
                return bench_lightning(net, *common)

            sps, lsps = _median(bare, args.repeats), _median(lightning, args.repeats)
            print(f"  bare loop : {sps:8.2f} steps/s")
            print(f"  Lightning : {lsps:8.2f} steps/s ({lsps / sps:.3f} x bare)")
    if args.only in (None, "hf"):
        torch.manual_seed(0)
        ours = RegressionTransformer(args.dims)
        hf = HFRegressionTransformer(args.dims)
        print(f"ours {count_parameters(ours)} parameters, HF GPT2Model body {count_parameters(hf)} parameters")
        a = _median(lambda: bench_bare(ours, *common), args.repeats)
        b = _median(lambda: bench_bare(hf, *common), args.repeats)
        print(f"  ours (SDPA, causal) : {a:8.2f} steps/s")
        print(f"  HF GPT2Model        : {b:8.2f} steps/s")
        print(f"  ours / HF           : {a / b:8.3f}")


if __name__ == "__main__":
    main()
