"""Latency per query of zero-shot, I2CL and few-shot ICL (and the task vector) on the offline model.

    python benchmarks/i2cl_latency.py [--model data/i2cl/smollm2-135m-instruct] [--queries 40] [--batch 1]

Times the forward pass that scores one query (tokenisation included) with the same evaluation queries for every
method, after one warm-up batch, and prints median and mean milliseconds per query plus the ratios to zero-shot.
I2CL's latency does not depend on the coefficients' values, so the default initialisation is used (no
calibration needed). Few-shot ICL re-reads its demonstrations for every query (no KV cache), as the module does.
Runs on the GPU when one is visible (bf16), else on CPU (float32); set OMP_NUM_THREADS to pin CPU threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from bench_options import at_least

from lit_icl.i2cl.data import I2CLDataModule
from lit_icl.i2cl.module import I2CLModule
from lit_icl.i2cl.nets import CausalLM


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="data/i2cl/smollm2-135m-instruct")
    p.add_argument("--train-file", default="data/i2cl/movie_reviews/train.jsonl")
    p.add_argument("--test-file", default="data/i2cl/movie_reviews/test.jsonl")
    p.add_argument("--queries", type=at_least(1), default=40)
    p.add_argument("--batch", type=at_least(1), default=1)
    p.add_argument("--methods", default="zero_shot,i2cl,task_vector,few_shot")
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    args = p.parse_args(argv)

    net = CausalLM(args.model)
    dm = I2CLDataModule(task="jsonl", train_file=args.train_file, test_file=args.test_file,
                        template="Review: {text}\nSentiment:", label_words=["negative", "positive"],
                        eval_samples=args.queries, holdout_samples=0)
    methods = args.methods.split(",")
    module = I2CLModule(net=net, methods=methods)
    if torch.cuda.is_available():
        module.cuda()
    module.bind_datamodule(dm)
    data = dm.task_data()
    if "i2cl" in methods:
        module.ctx_i2cl.copy_(net.demonstration_vectors(data.demo_texts).mean(0))
    if "task_vector" in methods:
        module.task_vector = net.last_hidden_per_layer(data.prefix + data.query(data.extra_query[0]))
        module.tv_layer = net.n_layers // 2  # latency does not depend on the layer chosen
    texts = [t for t, _ in data.eval]
    batches = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    per_query: dict[str, list[float]] = {}
    for m in methods:
        module.predict_method(m, batches[0])  # warm-up
        times = []
        for b in batches:
            sync()
            t0 = time.perf_counter()
            module.predict_method(m, b)
            sync()
            times.append(1000.0 * (time.perf_counter() - t0) / len(b))
        per_query[m] = times
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {device}; {len(texts)} queries, batch {args.batch}; "
          f"demonstration tokens: {net.n_tokens(data.prefix)}")
    print("| method | median ms/query | mean ms/query | median / zero-shot |")
    print("|---|---|---|---|")
    base = statistics.median(per_query["zero_shot"]) if "zero_shot" in per_query else None
    out = {"device": device, "queries": len(texts), "batch": args.batch, "methods": {}}
    for m, t in per_query.items():
        med, mean = statistics.median(t), statistics.fmean(t)
        ratio = med / base if base else float("nan")
        out["methods"][m] = {"median_ms": med, "mean_ms": mean, "ratio_to_zero_shot": ratio}
        print(f"| {m} | {med:.1f} | {mean:.1f} | {ratio:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
