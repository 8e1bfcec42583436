"""CoQE on Omniglot-style sequences: generator throughput, and training steps/s through Lightning vs a bare loop.

    python benchmarks/coqe_throughput.py                       # everything, CPU (or GPU when present)
    python benchmarks/coqe_throughput.py --only generator
    python benchmarks/coqe_throughput.py --steps 20 --image-size 28 --device cuda

Sections:

- ``generator``: sequences/s of the index sampler alone (training, ICL, IWL chunks; 1,623 classes, 20
  drawings) and of the on-device image gather;
- ``train``: steps/s (batch 24) for the Transformer (E = 64, L = 12) and CoQE (E = 512, L = 4): a bare PyTorch
  loop (sampler -> gather -> forward/backward/Adam) vs ``Trainer.fit`` with the real data module (no logger,
  checkpoints or validation), and the data share of the bare step.

The image bank is random uint8 of the real shape unless ``--folder`` points at an Omniglot-layout folder
(image content does not change the speed).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from bench_options import at_least
from lightning.pytorch import Callback, Trainer

from lit_icl.coqe.omniglot.data import (
    OmniglotSequenceDataModule,
    gather_images,
    load_bank,
    make_class_split,
    sample_chunk,
)
from lit_icl.coqe.omniglot.module import CoQEClassificationModule
from lit_icl.coqe.omniglot.nets import CoQEClassifier, SequenceTransformer
from lit_icl.core.nets import count_parameters
from lit_icl.core.seeding import make_generator


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_generator(bank: torch.Tensor, device: torch.device, chunk: int = 24, seconds: float = 2.0) -> None:
    split = make_class_split(bank.shape[0], 10, 10, 1.0)
    for kind in ("train", "icl", "iwl"):
        n, i, start = 0, 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            sample_chunk(split, kind, chunk, bank.shape[1], make_generator(0, kind, i))
            n, i = n + chunk, i + 1
        rate = n / (time.perf_counter() - start)
        print(f"generator {kind:5s}: {rate:10.0f} sequences/s ({1e3 * chunk / rate:.2f} ms per {chunk})")
    dev_bank = bank.to(device)
    idx = sample_chunk(split, "train", chunk, bank.shape[1], make_generator(0, "x", 0))
    idx = {k: v.to(device) for k, v in idx.items()}
    aug = torch.randint(8, idx["classes"].shape, device=device)
    for name, a in (("no augmentation", idx["augment"]), ("8x augmentation", aug)):
        gather_images(dev_bank, idx["classes"], idx["exemplars"], a)
        _sync(device)
        reps, start = 50, time.perf_counter()
        for _ in range(reps):
            gather_images(dev_bank, idx["classes"], idx["exemplars"], a)
        _sync(device)
        print(f"gather ({name}, {chunk} seq, {device.type}): {1e3 * (time.perf_counter() - start) / reps:.2f} ms")


def _nets(n_classes: int) -> dict[str, torch.nn.Module]:
    return {
        "transformer E=64 L=12": SequenceTransformer(n_classes, 64, 12),
        "coqe E=512 L=4": CoQEClassifier(n_classes, 512, 4),
    }


def bench_bare(net: torch.nn.Module, bank: torch.Tensor, device: torch.device, steps: int, batch: int) -> tuple[float, float]:
    """(steps/s, data fraction) of a plain loop with the same objective as the module (noise included)."""
    split = make_class_split(bank.shape[0], 10, 10, 1.0)
    net = net.to(device).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    dev_bank = bank.to(device)
    data_t, total_t = 0.0, 0.0
    for i in range(steps + 1):  # step 0 warms up
        _sync(device)
        t0 = time.perf_counter()
        idx = sample_chunk(split, "train", batch, bank.shape[1], make_generator(0, "train", i))
        idx = {k: v.to(device, non_blocking=True) for k, v in idx.items()}
        images = gather_images(dev_bank, idx["classes"], idx["exemplars"], idx["augment"])
        _sync(device)
        t1 = time.perf_counter()
        labels = idx["labels"]
        noise = 5 + torch.randn(batch, net.n_classes, device=device) if net.method == "coqe" else None
        out = net(images, labels[:, :-1], noise)
        loss = F.cross_entropy(out.logits[:, -1].float(), labels[:, -1])
        if out.static_logits is not None:
            loss = loss + F.cross_entropy(out.static_logits[:, -1].float(), labels[:, -1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _sync(device)
        t2 = time.perf_counter()
        if i:
            data_t += t1 - t0
            total_t += t2 - t0
    return steps / total_t, data_t / total_t


class _Timer(Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        _sync(pl_module.device)
        self.times.append(time.perf_counter())


def bench_lightning(net: torch.nn.Module, folder: str | None, device: torch.device, steps: int, batch: int,
                    image_size: int, precision: str) -> float:
    dm = OmniglotSequenceDataModule(
        folder=folder, source="omniglot" if folder else "auto", image_size=image_size, batch_size=batch,
        chunk_size=batch, train_batches_per_epoch=steps + 1, eval_batch_size=batch, val_sequences=batch,
        test_sequences=batch,
    )
    model = CoQEClassificationModule(net)
    timer = _Timer()
    trainer = Trainer(
        accelerator=device.type, devices=1, max_steps=steps + 1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=[timer],
        precision=precision,
    )
    trainer.fit(model, datamodule=dm)
    t = timer.times
    return (len(t) - 1) / (t[-1] - t[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["generator", "train"], default=None)
    parser.add_argument("--steps", type=at_least(1), default=5)
    parser.add_argument("--batch", type=at_least(1), default=24)
    parser.add_argument("--image-size", type=at_least(1), default=105)
    parser.add_argument("--folder", default=None, help="Omniglot-layout folder (default: data/ as the configs)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--nets", default="all", choices=["all", "transformer", "coqe"])
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, image {args.image_size}")
    if args.folder:
        bank = load_bank(args.folder, args.image_size)
    else:
        bank = torch.randint(0, 256, (1623, 20, args.image_size, args.image_size), dtype=torch.uint8)
    if args.only in (None, "generator"):
        bench_generator(bank, device)
    if args.only in (None, "train"):
        for name, net in _nets(bank.shape[0] - 10).items():
            if args.nets != "all" and not name.startswith(args.nets):
                continue
            print(f"{name}: {count_parameters(net) / 1e6:.2f}M parameters")
            state = {k: v.clone() for k, v in net.state_dict().items()}
            sps, frac = bench_bare(net, bank, device, args.steps, args.batch)
            print(f"  bare loop : {sps:7.3f} steps/s (data {100 * frac:.1f} % of the step)")
            net.load_state_dict(state)
            lsps = bench_lightning(net, args.folder, device, args.steps, args.batch, args.image_size, args.precision)
            print(f"  Lightning : {lsps:7.3f} steps/s ({lsps / sps:.2f} x bare)")


if __name__ == "__main__":
    main()
