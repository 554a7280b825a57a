"""PyTorch 1.13 baseline for the modelstate benchmarks (CPU, float32).

For each model of bench_models.MODELS it times, as the median of --reps
repetitions after --warmup unrecorded ones (time.perf_counter, with
gc.collect() before each):
  construct        torch.manual_seed(0), then the model's constructor
                   (default initialisation).
  load_state_dict  model.load_state_dict(sd) (strict, copying into the
                   existing tensors), sd being the state_dict of another
                   instance built with another seed.
  to_float16       model.to(torch.float16) of a fresh float32 copy (the
                   copy, made with copy.deepcopy, is not timed).
It also records the parameter count and the state_dict size in bytes.

--smoke times tiny variants instead (mlp, gpt2_tiny, linear64_tiny), in a
few seconds, so that the script can run in the test suite.

Usage (Debian's /usr/bin/python3, which has torch 1.13):
    torch_bench.py --threads 2 --reps 5 --warmup 1 --out results.json
        [--models mlp,resnet50,gpt2,linear64] [--smoke]
Output: {"torch_version", "threads", "reps", "warmup", "smoke",
         "models": {name: {"params", "state_bytes", "construct":
         {"median_s", "samples_s", "warmup_s"}, "load_state_dict": {...},
         "to_float16": {...}}}}
"""
import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models  # pylint: disable=wrong-import-position

SMOKE_MODELS = {
    "mlp": bench_models.mlp,
    "gpt2_tiny": lambda: bench_models.gpt2(vocab=64, n_ctx=16, d=16,
                                           n_layer=2),
    "linear64_tiny": lambda: bench_models.linear64(depth=4, width=64),
}


def measure(timed, reps, warmup, setup=lambda: None):
    """Times timed(setup()) reps times after warmup unrecorded runs.

    Only timed() is timed. What it returns is freed after the clock stops,
    so that a constructor's timing does not include freeing the model.
    """
    warmup_s, samples_s = [], []
    for i in range(warmup + reps):
        arg = setup()
        gc.collect()
        start = time.perf_counter()
        result = timed(arg)
        elapsed = time.perf_counter() - start
        del arg, result
        (warmup_s if i < warmup else samples_s).append(elapsed)
    return {"median_s": statistics.median(samples_s),
            "samples_s": samples_s, "warmup_s": warmup_s}


def bench_model(make, reps, warmup):
    torch.manual_seed(0)
    model = make()
    torch.manual_seed(1)
    other = make().state_dict()
    sd = model.state_dict()
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "state_bytes": sum(t.numel() * t.element_size() for t in sd.values()),
        "construct": measure(lambda _: make(), reps, warmup,
                             setup=lambda: torch.manual_seed(0)),
        "load_state_dict": measure(lambda _: model.load_state_dict(other),
                                   reps, warmup),
        # .to() converts in place and returns the module.
        "to_float16": measure(lambda fresh: fresh.to(torch.float16),
                              reps, warmup,
                              setup=lambda: copy.deepcopy(model)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (interop threads: 1)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", required=True, help="results JSON file")
    parser.add_argument("--models", help="comma-separated names"
                        " (default: all of the chosen set)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models only, for the test suite")
    args = parser.parse_args()
    if args.reps < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("need --reps >= 1, --warmup >= 0, --threads >= 1")
    torch.set_num_interop_threads(1)  # Must come before any parallel work.
    torch.set_num_threads(args.threads)
    available = SMOKE_MODELS if args.smoke else bench_models.MODELS
    names = args.models.split(",") if args.models else list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {list(available)}")

    results = {"torch_version": torch.__version__, "threads": args.threads,
               "reps": args.reps, "warmup": args.warmup,
               "smoke": args.smoke, "models": {}}
    for name in names:
        r = bench_model(available[name], args.reps, args.warmup)
        results["models"][name] = r
        print(f"{name:14} {r['params']:>12,} params"
              f"  construct {r['construct']['median_s']:.4f} s"
              f"  load_state_dict {r['load_state_dict']['median_s']:.4f} s"
              f"  to_float16 {r['to_float16']['median_s']:.4f} s",
              flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
