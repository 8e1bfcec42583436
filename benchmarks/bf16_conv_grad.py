"""The weight gradient of CoQE's strided 3x3 convolution in bf16 on this machine's CPU, against float64.

    python benchmarks/bf16_conv_grad.py

For each input side (1x1 is what a 16-pixel image feeds the ResNet's last strided convolution) and dtype, prints
the largest error of ``conv2d(x, w, stride, padding=1)``'s weight gradient against the same in float64. Torch's
CPU bf16 kernel gets the 1x1, stride-2 case wrong, which is why ``ResNetEmbedder.check_config`` refuses bf16 on a
CPU for images of 16 pixels or less (docs/coqe_omniglot.md).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def weight_grad_error(side: int, stride: int, dtype: torch.dtype, channels: int = 16, batch: int = 8) -> float:
    """Largest absolute error of the weight gradient of ``sum(conv2d(x, w))`` in ``dtype`` against float64."""
    x = torch.randn(batch, channels, side, side, dtype=dtype)
    w = torch.randn(channels, channels, 3, 3, dtype=dtype, requires_grad=True)
    F.conv2d(x, w, stride=stride, padding=1).sum().backward()
    w64 = w.detach().double().requires_grad_()
    F.conv2d(x.double(), w64, stride=stride, padding=1).sum().backward()
    return (w.grad.double() - w64.grad).abs().max().item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    # Deterministic kernels on, new memory not filled, is how the CLI trains (trainer.deterministic: warn).
    for deterministic, fill in [(False, False), (True, True), (True, False)]:
        torch.use_deterministic_algorithms(deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        print(f"deterministic kernels {'on' if deterministic else 'off'}"
              + (f", new memory {'filled with NaN' if fill else 'not filled'}" if deterministic else ""))
        torch.manual_seed(args.seed)
        for side, stride in [(1, 2), (2, 2), (4, 2), (7, 2), (1, 1)]:
            for dtype in (torch.bfloat16, torch.float32):
                error = weight_grad_error(side, stride, dtype)
                print(f"  input {side}x{side}, stride {stride}, {str(dtype).removeprefix('torch.'):8s}: "
                      f"max |error| of the weight gradient {error:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
