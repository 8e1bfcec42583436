"""Where CoQE's IWL goes: the context path's term at the context classes of IWL and ICL test sequences.

    python experiments/coqe_context_terms.py RUN_DIR/checkpoints/last.ckpt --max-classes 400 --image-size 28

For a trained :class:`~lit_icl.coqe.CoQEClassifier` it draws ``--sequences`` IWL and ICL test sequences (the
evaluators of :class:`~lit_icl.coqe.OmniglotSequenceDataModule`, ``data_seed`` 0) and prints:

- IWL: the context-path term (modified minus static logit) at the context classes, which never match the query
  (median and 10/90 % quantiles); the static margin of the true class over the best context class; how often a
  context class answers the query;
- ICL: the mean context-path term at the matching class and at the other class.
"""

from __future__ import annotations

import argparse

import torch

from lit_icl.coqe import CoQEClassificationModule, OmniglotSequenceDataModule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--root", default="data")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--max-classes", type=int, default=None)
    parser.add_argument("--sequences", type=int, default=512)
    args = parser.parse_args()
    model = CoQEClassificationModule.load_from_checkpoint(args.checkpoint, map_location="cpu").eval()
    if model.method != "coqe":
        raise SystemExit(f"{args.checkpoint} holds a {model.method}, not CoQE: it has no static head to compare")
    dm = OmniglotSequenceDataModule(
        root=args.root, image_size=args.image_size, max_classes=args.max_classes,
        test_sequences=args.sequences, eval_batch_size=128,
    )
    dm.setup("test")
    iwl_terms, margins, wins, icl_match, icl_other = [], [], [], [], []
    for kind, loader in zip(("icl", "iwl"), dm.test_dataloader()):
        for batch in loader:
            batch = dm.on_after_batch_transfer(batch, 0)
            with torch.no_grad():
                out = model.net(batch["images"], batch["labels"][:, :-1])
            logits, static = out.logits[:, -1], out.static_logits[:, -1]
            y = batch["labels"][:, -1]
            in_context = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, batch["labels"][:, :-1], True)
            term = logits - static
            if kind == "icl":
                match = torch.zeros_like(in_context).scatter_(1, y[:, None], True)
                icl_match.append(term[in_context & match])
                icl_other.append(term[in_context & ~match])
                continue
            iwl_terms.append(term[in_context])
            best_context = static.masked_fill(~in_context, float("-inf")).max(1).values
            margins.append(static.gather(1, y[:, None])[:, 0] - best_context)
            wins.append(in_context.gather(1, logits.argmax(-1, keepdim=True))[:, 0])
    t, m, w = torch.cat(iwl_terms), torch.cat(margins), torch.cat(wins).float()
    print(f"IWL ({len(m)} sequences): context-path term at the context classes: median {t.median():+.1f}, "
          f"q10 {t.quantile(0.1):+.1f}, q90 {t.quantile(0.9):+.1f}")
    print(f"IWL: static margin of the true class over the best context class: median {m.median():.1f}")
    print(f"IWL: a context class answers {w.mean():.3f} of the queries")
    print(f"ICL ({len(torch.cat(icl_match))} sequences): context-path term at the matching class "
          f"{torch.cat(icl_match).mean():+.1f}, at the other class {torch.cat(icl_other).mean():+.1f}")


if __name__ == "__main__":
    main()
