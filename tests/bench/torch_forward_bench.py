"""PyTorch 1.13 baseline for forward_bench's GPT-2-small block (CPU, float32).

Times nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu",
norm_first=True, batch_first=True) in eval mode under torch.no_grad() on one
sequence of 1024 tokens with a causal float mask, exactly what
forward_bench's BM_Gpt2Block runs (the mask also keeps torch on the same
code path as modelstate: 1.13's fused fast path takes no src_mask). Also
times the same block without a mask (torch's fast path) for reference.

Each figure is the median of --reps repetitions after --warmup unrecorded
ones (time.perf_counter).

Usage (Debian's /usr/bin/python3, which has torch 1.13):
    torch_forward_bench.py --threads 2 --reps 5 --warmup 1 [--smoke]
        [--out results.json]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn


def time_block(block, args, reps, warmup):
    samples = []
    with torch.no_grad():
        for i in range(warmup + reps):
            start = time.perf_counter()
            block(*args)
            elapsed = time.perf_counter() - start
            if i >= warmup:
                samples.append(elapsed)
    return statistics.median(samples), samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    d, heads, seq = (64, 4, 16) if args.smoke else (768, 12, 1024)
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(d, heads, 4 * d, activation="gelu",
                                       norm_first=True, batch_first=True)
    block.eval()
    x = torch.rand(1, seq, d) * 2 - 1
    causal = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
    flops = 2.0 * seq * 12 * d * d + 4.0 * seq * seq * d
    results = {"torch_version": torch.__version__, "threads": args.threads,
               "reps": args.reps, "warmup": args.warmup, "d_model": d,
               "heads": heads, "seq": seq}
    for name, call_args in (("causal_mask", (x, causal)), ("no_mask", (x,))):
        median, samples = time_block(block, call_args, args.reps, args.warmup)
        results[name] = {"median_s": median, "samples_s": samples,
                         "gflops": flops / median * 1e-9,
                         "tokens_per_s": seq / median}
        print(f"{name:12s} median {median * 1e3:8.2f} ms  "
              f"{flops / median * 1e-9:7.1f} GFLOP/s  "
              f"{seq / median:9.0f} tokens/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
