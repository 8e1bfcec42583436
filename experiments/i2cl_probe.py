"""What I2CL starts from on one model, before any calibration: tokens, losses, vector sizes and the noise's effect.

    python experiments/i2cl_probe.py --model data/i2cl/gemma-3-270m [--seed 0] [--draws 3] [--hook-points write module]

Loads the model and the movie-review task as ``configs/i2cl/offline.yaml`` does (5 demonstrations per class drawn by
``--seed``; the 32 holdout queries), builds the context vectors (Eq. 2-3) and prints, in a few minutes on a CPU:

1. the tokenisation of one demonstration (what is vectorised) and of one query (what is calibrated and scored),
   and the label words' token ids: BOS first, the demonstration's last token the separator, no EOS appended;
2. Eq. 5's loss (full-vocabulary cross-entropy of the label token) and the 2-way accuracy (label words only) on
   the 10 demonstrations-as-queries and on the 32 holdout queries, at the starting coefficients ``lambda`` in
   {0, 0.01, 0.1}, ``beta = 1``, no noise (``lambda = 0`` is zero-shot);
3. per layer, the context vectors' norms against the median norm of the same sub-layer's write over the
   demonstrations' tokens (how large the injected ``lambda v`` is against what the sub-layer itself writes);
4. Eq. 5's loss on the demonstrations at ``lambda = 0.1, beta = 1`` under Eq. 6's noise (``gamma`` 1e-3), for each
   noise scaling (``stream``: the residual stream, the paper; ``sublayer``: the injected output, the public code),
   with noise at every position and with the first position spared (most LMs park attention on their first token,
   whose stream is the largest).

Sections 2-4 repeat for each hook point (``write``: what enters the residual stream; ``module``: the attention and
MLP modules' own outputs, the public code). Nothing is trained.

With ``--ckpt`` (an I2CL fit's ``last.ckpt``), it instead scores that checkpoint's calibrated coefficients on the
evaluation queries (``--queries``, the first N of the protocol's 500) taken apart: as calibrated, with the context
vectors removed (``lambda = 0``, the calibrated ``beta`` only), with the sub-layers unscaled (``beta = 1``, the
calibrated ``lambda`` only), at the starting coefficients (``lambda = 0.1, beta = 1``) and zero-shot:

    python experiments/i2cl_probe.py --ckpt runs/.../s0_fit/checkpoints/last.ckpt --model data/i2cl/gemma-3-270m \
        --seed 0 --hook-points module
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from lit_icl.i2cl import CausalLM, I2CLDataModule, I2CLModule
from lit_icl.i2cl.nets import ATTN, MLP


def _tokens(net: CausalLM, text: str) -> str:
    ids = net.tokenizer(text)["input_ids"]
    return " ".join(repr(t) for t in net.tokenizer.convert_ids_to_tokens(ids))


@torch.no_grad()
def _scores(net: CausalLM, prompts: list[str], labels: torch.Tensor, label_ids: torch.Tensor, v: torch.Tensor,
            coef: torch.Tensor, gamma: float = 0.0, noise_norm: str = "sublayer", noise_first: bool = True,
            batch: int = 8) -> tuple[float, float]:
    """(mean Eq. 5 loss, 2-way accuracy) of ``prompts`` under Eq. 4 (and Eq. 6's noise when ``gamma > 0``)."""
    losses, hits = [], []
    for i in range(0, len(prompts), batch):
        ids, mask = net.encode(prompts[i: i + batch])
        with net.inject(v, coef, gamma=gamma, noise_norm=noise_norm, noise_first=noise_first):
            logits = net.last_logits(ids, mask)
        y = labels[i: i + batch]
        losses.append(F.cross_entropy(logits, label_ids[y], reduction="none"))
        hits.append(logits[:, label_ids].argmax(-1).cpu() == y)
    return float(torch.cat(losses).mean()), float(torch.cat(hits).float().mean())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="data/i2cl/gemma-3-270m")
    p.add_argument("--seed", type=int, default=0, help="data_seed: which demonstrations")
    p.add_argument("--draws", type=int, default=3, help="noise draws per setting")
    p.add_argument("--gamma", type=float, default=1e-3)
    p.add_argument("--hook-points", nargs="+", choices=["write", "module"], default=["write", "module"])
    p.add_argument("--ckpt", help="an I2CL checkpoint: score its coefficients taken apart (the first hook point)")
    p.add_argument("--queries", type=int, default=500, help="evaluation queries for --ckpt")
    args = p.parse_args(argv)

    dm = I2CLDataModule(task="jsonl", train_file="data/i2cl/movie_reviews/train.jsonl",
                        test_file="data/i2cl/movie_reviews/test.jsonl", template="Review: {text}\nSentiment:",
                        label_words=["negative", "positive"], shots_per_class=5, data_seed=args.seed)
    if args.ckpt:
        ablate(args, dm)
        return
    for n, hook_point in enumerate(args.hook_points):
        net = CausalLM(args.model, hook_point=hook_point)
        module = I2CLModule(net=net, methods=["i2cl"], noise_norm="sublayer")
        module.bind_datamodule(dm)
        data, label_ids = module.data, module.label_ids
        if n == 0:
            print(f"# {args.model} (data_seed {args.seed}), post-norm blocks: {net.post_norm}\n")
            print(f"demonstration tokens: {_tokens(net, data.demo_texts[0])}")
            print(f"query tokens: {_tokens(net, data.query(data.eval[0][0]))}")
            print(f"label token ids: {dict(zip(data.label_words, label_ids.tolist()))} = "
                  f"{net.tokenizer.convert_ids_to_tokens(label_ids.tolist())}\n")
        if hook_point == "module" and not net.post_norm:
            print("## hook point module: the same modules as write on this model (no post-sub-layer norms)\n")
            continue
        print(f"## hook point {hook_point}\n")
        sets = {"demonstrations": data.demos, "holdout": data.holdout}
        prompts = {k: [data.query(t) for t, _ in ex] for k, ex in sets.items()}
        labels = {k: torch.tensor([y for _, y in ex]) for k, ex in sets.items()}
        v = net.demonstration_vectors(data.demo_texts).mean(0)
        L = net.n_layers

        def coef(lam: float, L: int = L) -> torch.Tensor:
            return torch.stack([torch.full((L, 2), lam), torch.ones(L, 2)], dim=-1)

        print("| lambda | loss (demonstrations) | 2-way acc. (demonstrations) | loss (holdout) | 2-way acc. (holdout) |")
        print("|---|---|---|---|---|")
        for lam in (0.0, 0.01, 0.1):
            d, h = (_scores(net, prompts[k], labels[k], label_ids, v, coef(lam)) for k in sets)
            print(f"| {lam:g} | {d[0]:.2f} | {d[1]:.3f} | {h[0]:.2f} | {h[1]:.3f} |")

        with torch.no_grad():
            ids, mask = net.encode(data.demo_texts)
            with net.capture() as store:
                net.lm.base_model(input_ids=ids, attention_mask=mask)
        real = mask.bool()
        print("\n| layer | norm v^a | median attention write | ratio | norm v^m | median MLP write | ratio |")
        print("|---|---|---|---|---|---|---|")
        for layer in range(L):
            cells = []
            for kind, key in ((ATTN, "attn"), (MLP, "mlp")):
                med = statistics.median(store[key][layer][real].float().norm(dim=-1).tolist())
                norm = float(v[layer, kind].norm())
                cells += [f"{norm:,.1f}", f"{med:,.1f}", f"{norm / med:.2f}"]
            print(f"| {layer} | " + " | ".join(cells) + " |")

        print(f"\nEq. 5 loss on the demonstrations at lambda 0.1, beta 1, gamma {args.gamma:g} (one value per draw; "
              f"no noise: {_scores(net, prompts['demonstrations'], labels['demonstrations'], label_ids, v, coef(0.1))[0]:.2f})\n")
        print("| noise scaled by | noise at position 0 | loss per draw |")
        print("|---|---|---|")
        norms = ["sublayer"] if hook_point == "module" and net.post_norm else ["stream", "sublayer"]
        for noise_norm in norms:
            for first in (True, False):
                losses = []
                for draw in range(args.draws):
                    torch.manual_seed(draw)
                    losses.append(_scores(net, prompts["demonstrations"], labels["demonstrations"], label_ids, v,
                                          coef(0.1), args.gamma, noise_norm, first)[0])
                print(f"| {noise_norm} | {'yes' if first else 'no'} | {', '.join(f'{x:.2f}' for x in losses)} |")
        print()


@torch.no_grad()
def ablate(args: argparse.Namespace, dm: I2CLDataModule) -> None:
    """Accuracy and macro-F1 of a checkpoint's coefficients taken apart, on the evaluation queries."""
    from torchmetrics.functional.classification import multiclass_f1_score

    state = torch.load(args.ckpt, map_location="cpu", weights_only=False)["state_dict"]
    coef, v = state["coefs.i2cl"].float(), state["ctx_i2cl"].float()
    net = CausalLM(args.model, hook_point=args.hook_points[0])
    module = I2CLModule(net=net, methods=["i2cl"])
    module.bind_datamodule(dm)
    data, label_ids = module.data, module.label_ids
    queries = data.eval[: args.queries]
    prompts = [data.query(t) for t, _ in queries]
    labels = torch.tensor([y for _, y in queries])
    lam, beta = coef[..., :1], coef[..., 1:]
    variants = {
        "as calibrated": coef,
        "context vectors removed (lambda = 0, calibrated beta)": torch.cat([torch.zeros_like(lam), beta], -1),
        "sub-layers unscaled (calibrated lambda, beta = 1)": torch.cat([lam, torch.ones_like(beta)], -1),
        "starting coefficients (lambda = 0.1, beta = 1)": torch.cat([torch.full_like(lam, 0.1), torch.ones_like(beta)], -1),
        "zero-shot (lambda = 0, beta = 1)": torch.cat([torch.zeros_like(lam), torch.ones_like(beta)], -1),
    }
    print(f"# {args.ckpt}: {len(queries)} evaluation queries, data_seed {args.seed}\n")
    print(f"calibrated lambda: mean {float(lam.mean()):.3f}, range {float(lam.min()):.3f} to {float(lam.max()):.3f}; "
          f"beta: mean {float(beta.mean()):.3f}, range {float(beta.min()):.3f} to {float(beta.max()):.3f}\n")
    print("| coefficients | accuracy | macro-F1 | share predicted as the first label word |")
    print("|---|---|---|---|")
    for name, c in variants.items():
        preds = []
        for i in range(0, len(prompts), 8):
            ids, mask = net.encode(prompts[i: i + 8])
            with net.inject(v, c):
                preds.append(net.last_logits(ids, mask)[:, label_ids].argmax(-1).cpu())
        pred = torch.cat(preds)
        f1 = float(multiclass_f1_score(pred, labels, num_classes=len(label_ids), average="macro"))
        print(f"| {name} | {float((pred == labels).float().mean()):.3f} | {f1:.3f} | {float((pred == 0).float().mean()):.3f} |")


if __name__ == "__main__":
    main()
