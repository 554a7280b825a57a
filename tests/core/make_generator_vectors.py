#!/usr/bin/python3
"""Writes generator_vectors.json: PyTorch 1.13's CPU random numbers.

Run with a Python that has torch 1.13 (here /usr/bin/python3):
    /usr/bin/python3 tests/core/make_generator_vectors.py

Reference path: the values are what `torch.manual_seed(seed)` followed by
`tensor.uniform_(a, b)` / `tensor.normal_(mean, std)` on contiguous CPU
tensors gives with ATEN_CPU_CAPABILITY unset, i.e. PyTorch's default kernel
choice, which on an x86-64 CPU with AVX2 is the AVX2 one (AVX-512 CPUs give the
same values: normal_ has no AVX-512 kernel, and uniform_'s matches AVX2's).
`ATEN_CPU_CAPABILITY=default` selects other kernels whose float32/float64
results differ in the last bits; the script refuses to run under it.

Each case is a fresh seed and a list of ops applied in turn to the same
generator. Each op records the raw bits of every element as one hex string
(elements of 4/8/2 bytes as 8/16/4 hex digits, most significant first) when
it has at most 100 elements; larger ops record FNV-1a 64 of the little-endian
bytes of the whole tensor plus the bits of a few sampled elements.
"""

import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "generator_vectors.json")

DTYPES = {
    "float32": (torch.float32, torch.int32, 8),
    "float64": (torch.float64, torch.int64, 16),
    "float16": (torch.float16, torch.int16, 4),
    "bfloat16": (torch.bfloat16, torch.int16, 4),
}
FULL_LIMIT = 100


def capability():
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def element_bits(t, dtype):
    _, int_dtype, digits = DTYPES[dtype]
    mask = (1 << (4 * digits)) - 1
    return [int(v) & mask for v in t.view(int_dtype).tolist()]


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def fnv1a64_tensor(t):
    return fnv1a64(t.contiguous().view(torch.uint8).numpy().tobytes())


def sample_indices(n):
    picks = {0, 1, 2, n // 3, n // 2, n - 17, n - 16, n - 2, n - 1}
    return sorted(i for i in picks if 0 <= i < n)


def run_op(op):
    torch_dtype, _, digits = DTYPES[op["dtype"]]
    t = torch.empty(op["count"], dtype=torch_dtype)
    if op["op"] == "uniform":
        t.uniform_(op["a"], op["b"])
    else:
        t.normal_(op["a"], op["b"])
    record = dict(op)
    bits = element_bits(t, op["dtype"])
    if op["count"] <= FULL_LIMIT:
        record["bits"] = "".join("%0*x" % (digits, b) for b in bits)
    else:
        record["fnv1a64"] = "%016x" % fnv1a64_tensor(t)
        record["samples"] = {
            str(i): "%0*x" % (digits, bits[i]) for i in sample_indices(len(bits))
        }
    return record


def run_case(name, seed, ops):
    torch.manual_seed(seed)
    return {"name": name, "seed": seed, "ops": [run_op(op) for op in ops]}


def op(kind, dtype, count, a, b):
    return {"op": kind, "dtype": dtype, "count": count, "a": a, "b": b}


def main():
    env = os.environ.get("ATEN_CPU_CAPABILITY", "")
    cap = capability()
    if env == "default" or cap not in ("AVX2", "AVX512"):
        sys.exit("needs PyTorch's AVX2 kernels (ATEN_CPU_CAPABILITY unset on "
                 "an AVX2 CPU); got env=%r, capability %r" % (env, cap))
    torch.set_num_threads(1)

    seeds = [0, 1, 42, 2**32 + 5]
    counts = [1, 2, 3, 7, 15, 16, 17, 31, 33, 100, 1000, 4097]
    # Kaiming bounds 1/sqrt(fan_in), in Python double precision.
    fan_ins = [3, 768, 1024, 50257]
    cases = []
    for seed_index, seed in enumerate(seeds):
        bound = 1 / math.sqrt(fan_ins[seed_index])
        for dtype in DTYPES:
            for count in counts:
                for kind, a, b, label in [
                    ("uniform", -bound, bound,
                     "uniform(-1/sqrt(%d))" % fan_ins[seed_index]),
                    ("uniform", 0.0, 1.0, "uniform(0,1)"),
                    ("normal", 0.0, 1.0, "normal(0,1)"),
                    ("normal", 2.5, 0.1, "normal(2.5,0.1)"),
                ]:
                    name = "seed %d %s %s x%d" % (seed, dtype, label, count)
                    cases.append(
                        run_case(name, seed, [op(kind, dtype, count, a, b)]))

    b3 = 1 / math.sqrt(3)
    sequences = [
        ("uniform, normal, uniform on one generator", 0, [
            op("uniform", "float32", 100, -b3, b3),
            op("normal", "float32", 33, 0.0, 1.0),
            op("uniform", "float32", 7, 0.0, 1.0),
        ]),
        ("odd serial normals reuse the cached Box-Muller sample", 42, [
            op("normal", "float32", 7, 0.0, 1.0),
            op("normal", "float32", 7, 0.0, 1.0),
            op("normal", "float32", 1, 2.5, 0.1),
            op("normal", "float64", 3, 0.0, 1.0),
            op("normal", "float64", 3, -1.0, 3.0),
        ]),
        ("the cached sample is shared across dtypes", 1, [
            op("normal", "float64", 15, 0.0, 1.0),
            op("normal", "float32", 3, 0.0, 1.0),
            op("normal", "float16", 5, 2.5, 0.1),
            op("normal", "bfloat16", 1, 0.0, 1.0),
            op("normal", "float32", 16, 0.0, 1.0),
            op("normal", "float32", 1, 0.0, 1.0),
        ]),
        ("random64 straddling a 624-word block", 2**32 + 5, [
            op("uniform", "float32", 623, 0.0, 1.0),
            op("uniform", "float64", 3, -b3, b3),
            op("normal", "float32", 100, 0.0, 1.0),
            op("normal", "float64", 17, 2.5, 0.1),
            op("uniform", "float64", 311, 0.0, 1.0),
            op("normal", "float64", 33, 0.0, 1.0),
        ]),
        ("reduced types in sequence", 42, [
            op("uniform", "float16", 17, -b3, b3),
            op("normal", "bfloat16", 33, 0.0, 1.0),
            op("uniform", "bfloat16", 1000, -b3, b3),
            op("normal", "float16", 4097, 0.0, 0.02),
            op("normal", "bfloat16", 15, 0.0, 1.0),
        ]),
        ("GPT-2 sized float32 ops", 0, [
            op("normal", "float32", 50257 * 768, 0.0, 0.02),
            op("uniform", "float32", 768 * 2304 + 5, -1 / math.sqrt(768),
               1 / math.sqrt(768)),
            op("normal", "float32", 1024 * 768 + 3, 0.0, 0.02),
        ]),
    ]
    for name, seed, ops in sequences:
        cases.append(run_case(name, seed, ops))

    # Seeds keep only their low 32 bits (at::mt19937 seeds from seed &
    # 0xffffffff); record the check that made us sure.
    torch.manual_seed(2**32 + 5)
    high = torch.empty(64).uniform_()
    torch.manual_seed(5)
    low = torch.empty(64).uniform_()
    seed_low_32_bits = bool(torch.equal(high, low))

    about = {
        "torch_version": torch.__version__,
        "ATEN_CPU_CAPABILITY": env or "(unset)",
        "cpu_capability_usage": cap,
        "generator": "tests/core/make_generator_vectors.py",
        "seed_uses_low_32_bits": seed_low_32_bits,
        "format": "bits: hex per element, most significant digit first, "
                  "concatenated; large ops: fnv1a64 of little-endian bytes "
                  "plus samples {index: bits}",
    }
    with open(OUT, "w") as f:
        json.dump({"_about": about, "cases": cases}, f, indent=0,
                  separators=(",", ":"))
        f.write("\n")
    print("wrote %s (%d cases, %d bytes)" % (OUT, len(cases),
                                            os.path.getsize(OUT)))


if __name__ == "__main__":
    main()
