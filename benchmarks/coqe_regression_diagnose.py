"""Short bare-loop training runs of the regression nets, for diagnosing optimisation (not a benchmark of speed).

Trains CoQE or the Transformer on linear functions with the package's generator and nets (Adam, batch 64, the
all-prefix MSE of Sec. 5.1) and prints, every ``--eval-every`` steps, the normalised error (squared error / d) on
fixed ID prompts at k = 0, d/2, d, 2d in-context examples, the mean over all k, and least squares' at the same k.
Use ONE thread on a shared CPU::

    OMP_NUM_THREADS=1 python benchmarks/coqe_regression_diagnose.py --net coqe --lr 1e-3 --steps 3000

Every option of the nets can be passed as ``--net-arg key=value`` (e.g. ``--net-arg task_head=mlp``).
"""

from __future__ import annotations

import argparse
import ast
import json
import time

import torch

from lit_icl.coqe.regression.data import Curriculum, sample_prompts
from lit_icl.coqe.regression.nets import CoQERegressor, LeastSquares, RegressionTransformer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", choices=["coqe", "transformer"], default="coqe")
    p.add_argument("--d", type=int, default=5)
    p.add_argument("--n", type=int, default=11, help="points per prompt")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=0, help="linear warm-up steps")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--curriculum-points", type=str, default=None, help="start,end,inc,interval")
    p.add_argument("--curriculum-dims", type=str, default=None, help="start,end,inc,interval")
    p.add_argument("--net-arg", action="append", default=[], help="key=value passed to the net")
    p.add_argument("--clip", type=float, default=0.0, help="gradient-norm clip (0 = none)")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-prompts", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=1e9)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    kw = {k: ast.literal_eval(v) if v[:1].isdigit() or v[:1] in "-[(" or v in ("True", "False") else v
          for k, v in (s.split("=", 1) for s in a.net_arg)}
    cls = CoQERegressor if a.net == "coqe" else RegressionTransformer
    net = cls(n_dims=a.d, width=a.width, depth=a.depth, heads=a.heads, max_points=a.n, **kw)
    opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / a.warmup) if a.warmup else 1.0)
    cur = {k: Curriculum(*map(int, v.split(","))) if v else None
           for k, v in (("points", a.curriculum_points), ("dims", a.curriculum_dims))}
    ev = sample_prompts("linear", a.eval_prompts, a.n, a.d, torch.Generator().manual_seed(10_000 + a.seed))
    ks = sorted({0, a.d // 2, a.d, min(2 * a.d, a.n - 1)})
    ls = ((LeastSquares()(ev["xs"], ev["ys"]) - ev["ys"]) ** 2).mean(0) / a.d
    print(json.dumps({"args": vars(a), "k": ks, "least_squares": [round(float(ls[k]), 3) for k in ks]}))
    g = torch.Generator().manual_seed(a.seed)
    t0 = time.time()
    for step in range(a.steps + 1):
        if step % a.eval_every == 0 or step == a.steps:
            net.eval()
            with torch.no_grad():
                err = ((net(ev["xs"], ev["ys"]) - ev["ys"]) ** 2).mean(0) / a.d
            net.train()
            print(json.dumps({"step": step, "s": round(time.time() - t0, 1), "mean": round(float(err.mean()), 4),
                              "at_k": [round(float(err[k]), 3) for k in ks]}), flush=True)
        if step == a.steps or time.time() - t0 > a.max_seconds:
            break
        n = cur["points"].value(step) if cur["points"] else a.n
        dims = cur["dims"].value(step) if cur["dims"] else a.d
        b = sample_prompts("linear", a.batch, n, a.d, g, active_dims=dims)
        loss = ((net(b["xs"], b["ys"]) - b["ys"]) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), a.clip)
        opt.step()
        sched.step()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
