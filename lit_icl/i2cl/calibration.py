"""I2CL's calibration (Sec. 2.4): how the coefficients enter Eq. 4, the learning-rate schedules, the Eq. 5 loss
under Eq. 6's noise, the plain calibration loop, and Algorithm 1's transfer from other tasks' task-ids.

:class:`lit_icl.i2cl.module.I2CLModule` runs the same loss under Lightning (one optimiser per calibrated method);
:func:`calibrate` is the loop Algorithm 1 runs first, also usable outside Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.seeding import make_generator
from lit_icl.core.transfer import to_device
from lit_icl.i2cl.contracts import I2CLNet
from lit_icl.i2cl.nets import NoiseNorm

#: The calibration's learning-rate schedule (see :func:`lr_lambda`).
LRSchedule = Literal["cosine", "public_code"]
#: How the coefficients enter Eq. 4 (see :func:`injection_coefficients`).
InjectMethod = Literal["linear", "add", "fixed_beta"]


def injection_coefficients(coef: Tensor, inject_method: str) -> Tensor:
    """The ``(L, 2, 2)`` ``(lambda, beta)`` that Eq. 4 applies, from the trained coefficients.

    ``linear`` (Eq. 4): both as trained. ``add`` (the public code's ``inject_method: add``): ``a + relu(lambda) v``,
    so ``beta`` stays 1 and only the context vectors' weights are calibrated (half the parameters, and the LM's own
    sub-layer outputs are never rescaled). ``fixed_beta``: Eq. 4 with ``beta`` held at 1 and ``lambda`` as trained
    (of either sign): what Gemma's calibrations taken apart point to, where the trained ``beta`` cost accuracy.
    """
    if inject_method == "add":
        return torch.stack([F.relu(coef[..., 0]), torch.ones_like(coef[..., 1])], dim=-1)
    if inject_method == "fixed_beta":
        return torch.stack([coef[..., 0], torch.ones_like(coef[..., 1])], dim=-1)
    return coef


def cosine_lambda(step: int, total: int, lr: float, lr_min: float, warmup: int) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine from ``lr`` to ``lr_min`` at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = lr_min / lr
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def public_code_lambda(step: int, total: int, warmup: int) -> float:
    """The public code's LR multiplier: ``step / warmup`` up to ``warmup`` (so the first step has LR 0), then
    ``(1 + cos(pi step / total)) / 2``, which reaches 0 at ``total`` (the cosine counts from step 0, not from the
    end of the warm-up)."""
    if warmup > 0 and step <= warmup:
        return step / warmup
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(1, total)))


def lr_lambda(schedule: str, step: int, total: int, lr: float, lr_min: float, warmup: int) -> float:
    """``cosine``: :func:`cosine_lambda` (the paper: cosine to ``lr_min``); ``public_code``: :func:`public_code_lambda`."""
    if schedule == "public_code":
        return public_code_lambda(step, total, warmup)
    return cosine_lambda(step, total, lr, lr_min, warmup)


def calibration_loss(
    net: I2CLNet, context: Tensor, coef: Tensor, prompts: Sequence[str], targets: Tensor, gamma: float,
    noise_norm: NoiseNorm = "sublayer", inject_method: InjectMethod = "linear",
) -> Tensor:
    """Eq. 5 on one batch: CE of the label's first token at each prompt's last position, under Eq. 4 (+ Eq. 6).

    The forward is ``net.calibration_logits``. When that is compiled, Eq. 6's draws are made ahead
    (``net.draw_noise``: the eager run's values) and fed to the graph, so a compiled calibration sees the same noise
    as an eager one.
    """
    ids, mask = net.encode(prompts)
    noise = net.draw_noise(ids) if gamma > 0 and net.calibration_compiled else None
    with net.inject(context, injection_coefficients(coef, inject_method), gamma=gamma, noise_norm=noise_norm,
                    noise=noise):
        logits = net.calibration_logits(ids, mask)
    return F.cross_entropy(logits, to_device(targets, logits.device))  # host targets: no device sync


def calibrate(
    net: I2CLNet,
    context: Tensor,
    coef_init: Tensor,
    prompts: Sequence[str],
    targets: Tensor,
    *,
    epochs: int = 100,
    batch_size: int = 2,
    lr: float = 1e-2,
    lr_min: float = 1e-5,
    weight_decay: float = 1e-3,
    gamma: float = 1e-3,
    warmup_fraction: float = 0.0,
    seed: int = 0,
    noise_norm: NoiseNorm = "sublayer",
    lr_schedule: LRSchedule = "cosine",
    replacement: bool = False,
    inject_method: InjectMethod = "linear",
) -> tuple[Tensor, list[float]]:
    """Noisy self-calibration as a plain loop (Algorithm 1's first calibration, and for use outside Lightning).

    ``replacement``: each step draws its batch afresh (distinct examples within a batch, as the public code)
    instead of walking one shuffle per epoch. Returns the calibrated ``(L, 2, 2)`` coefficients and the mean loss
    of each epoch.
    """
    coef = nn.Parameter(coef_init.detach().clone().float())
    n = len(prompts)
    steps_per_epoch = max(1, n // batch_size)
    total = epochs * steps_per_epoch
    opt = torch.optim.AdamW([coef], lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_lambda(lr_schedule, s, total, lr, lr_min, int(warmup_fraction * total))
    )
    history = []
    noise = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=make_generator(seed, "i2cl_plain_calibration", epoch)).tolist()
        losses = []
        for s in range(steps_per_epoch):
            if replacement:
                step = epoch * steps_per_epoch + s
                idx = torch.randperm(n, generator=make_generator(seed, "i2cl_plain_draw", step))[:batch_size].tolist()
            else:
                idx = perm[s * batch_size : (s + 1) * batch_size]
            opt.zero_grad()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(torch.randint(2**62, (1,), generator=noise)))
                loss = calibration_loss(net, context, coef, [prompts[i] for i in idx], targets[idx], gamma, noise_norm,
                                        inject_method)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
        history.append(sum(losses) / len(losses))
    return coef.detach(), history


def task_similarity(c_new: Tensor, sources_coef: Tensor) -> Tensor:
    """Algorithm 1, line 7: cosine similarity of the flattened task-id ``c_new`` (L, 2, 2) with each source's."""
    return F.cosine_similarity(sources_coef.flatten(1).float(), c_new.flatten().float()[None], dim=1)


def transfer_init(
    c_new: Tensor, sources_coef: Tensor, sources_ctx: Tensor, threshold: float = 0.8, temperature: float = 0.5
) -> tuple[Tensor, Tensor, Tensor] | None:
    """Algorithm 1, lines 6-14: ``(v_avg, c_avg, weights)`` over sources with cosine(c_new, c_i) > h, else None."""
    sims = task_similarity(c_new, sources_coef)
    keep = sims > threshold
    if not bool(keep.any()):
        return None
    p = torch.zeros_like(sims)
    p[keep] = torch.softmax(sims[keep] / temperature, dim=0)
    v = torch.einsum("k,k...->...", p, sources_ctx.float())
    c = torch.einsum("k,k...->...", p, sources_coef.float())
    return v, c, p


def read_task_id(path: str) -> tuple[Tensor, Tensor]:
    """``(coef (L, 2, 2), context (L, 2, D))`` of the ``i2cl`` method in an I2CL checkpoint (a task-id)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError) as err:
        raise ConfigError(
            f"cannot read task-id checkpoint {path!r} ({type(err).__name__}): give the last.ckpt of an I2CL fit of "
            "each source task (configs/i2cl/offline/transfer.yaml shows the offline recipe)"
        ) from None
    sd = ckpt.get("state_dict", {})
    if "coefs.i2cl" not in sd or "ctx_i2cl" not in sd:
        raise ConfigError(f"{path!r} holds no calibrated 'i2cl' coefficients; give checkpoints of I2CL fits")
    return sd["coefs.i2cl"].float(), sd["ctx_i2cl"].float()
