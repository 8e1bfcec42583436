"""How much Eq. 6's calibration noise moves an offline model's calibration loss, before any calibration.

    python experiments/i2cl_noise_probe.py --model data/i2cl/gemma-3-270m [--seed 0] [--draws 3]

Loads the model and the movie-review task exactly as ``configs/i2cl/offline.yaml`` does (5 demonstrations per
class, ``data_seed`` = ``--seed``), builds the context vectors (Eq. 2-3), and prints Eq. 5's loss on the
demonstrations at the initial coefficients (lambda 0.1, beta 1) for gamma in {0, 1e-4, 1e-3} and both noise
norms (``stream``: Eq. 6 as written; ``sublayer``: the public code), one value per noise draw; then the norms of
the residual stream and of the two writes at each layer's last token, which set the noise's size, and how much of
the stream's squared norm sits in its largest coordinate (isotropic noise scaled by the whole norm is large
against every other coordinate when one coordinate dominates). Nothing is
trained; it explains why calibration reaches a given loss on one model and not on another.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from lit_icl.i2cl import CausalLM, I2CLDataModule, I2CLModule


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="data/i2cl/gemma-3-270m")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draws", type=int, default=3)
    args = p.parse_args(argv)

    net = CausalLM(args.model)
    dm = I2CLDataModule(task="jsonl", train_file="data/i2cl/movie_reviews/train.jsonl",
                        test_file="data/i2cl/movie_reviews/test.jsonl", template="Review: {text}\nSentiment:",
                        label_words=["negative", "positive"], shots_per_class=5, data_seed=args.seed)
    module = I2CLModule(net=net, methods=["i2cl"])
    module.bind_datamodule(dm)
    data = module.data
    prompts = [data.query(t) for t, _ in data.demos]
    targets = module.label_ids[torch.tensor([y for _, y in data.demos])]
    L = net.n_layers
    coef = torch.stack([torch.full((L, 2), 0.1), torch.ones(L, 2)], dim=-1)
    with torch.no_grad():
        ids, mask = net.encode(prompts)
        v = net.demonstration_vectors(data.demo_texts).mean(0)
        print(f"{args.model}: Eq. 5 loss on the {len(prompts)} demonstrations at lambda 0.1, beta 1")
        print("| noise norm | gamma | loss per draw |")
        print("|---|---|---|")
        for noise_norm in ("stream", "sublayer"):
            for gamma in (0.0, 1e-4, 1e-3):
                losses = []
                for draw in range(args.draws):
                    torch.manual_seed(draw)
                    with net.inject(v, coef, gamma=gamma, noise_norm=noise_norm):
                        losses.append(float(F.cross_entropy(net.last_logits(ids, mask), targets)))
                print(f"| {noise_norm} | {gamma:g} | {', '.join(f'{x:.2f}' for x in losses)} |")
        with net.capture() as store:
            net.lm.base_model(input_ids=ids[:1], attention_mask=mask[:1])
        first = int(mask[0].sum()) - 1
        print("\nlast-token L2 norms of the first demonstration query, per layer:")
        print("| layer | residual stream | its largest coordinate's share of the squared norm | attention write | MLP write |")
        print("|---|---|---|---|---|")
        for layer in range(L):
            stream = store["hidden"][layer][0, first].float()
            share = float(stream.abs().max() ** 2 / stream.pow(2).sum())
            norms = [float(store[k][layer][0, first].norm()) for k in ("attn", "mlp")]
            print(f"| {layer} | {float(stream.norm()):,.0f} | {share:.2f} | " + " | ".join(f"{x:,.0f}" for x in norms) + " |")


if __name__ == "__main__":
    main()
