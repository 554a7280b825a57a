#!/usr/bin/python3
"""Writes dtype_vectors.inc: expected results of every dtype pair's
conversion, computed by real PyTorch (1.13, CPU), for dtype_test.cc.

Usage (needs a python with torch; on the dev machine that is /usr/bin/python3,
not the python3 on PATH):
    /usr/bin/python3 tests/core/make_dtype_vectors.py

Each row is {source dtype, destination dtype, source bits, expected bits},
bits being the element's raw little-endian bytes as an unsigned integer.

Left out, because PyTorch's result is undefined behaviour in C++ (x86 gives
its "integer indefinite" pattern; modelstate documents its own rule in
core/dtype.h and dtype_test.cc checks that rule separately):
  - NaN or +-inf -> any integer type;
  - floating -> int8/int16/int32/int64 when the truncated value does not fit;
  - floating -> uint8 when the truncated value does not fit int64 (c10 goes
    through int64 for uint8, so -1.0 -> 255 is defined and kept).

The table is generated with ATEN_CPU_CAPABILITY=default, i.e. PyTorch's
portable kernels. The script also runs itself again with the CPU's own
capability (AVX2 here) and checks that the only differences are float32 or
float64 NaN -> bfloat16, where the AVX2/AVX-512 kernel writes 0xFFFF (for
float64 only inside whole 16-element vector blocks; the tail gets 0x7FC0) and
the portable kernel, like c10::BFloat16(float), writes 0x7FC0; modelstate
follows the portable rule (see core/dtype.h). The differences are listed in the header
of the generated file.
"""

import json
import math
import os
import subprocess
import sys

CAPABILITY_ENV = "ATEN_CPU_CAPABILITY"
if __name__ == "__main__" and "--dump-json" not in sys.argv:
    # Must be set before torch is imported; see the docstring.
    os.environ[CAPABILITY_ENV] = "default"

import numpy as np  # noqa: E402
import torch  # noqa: E402

# (modelstate enum name, torch dtype, bits in the storage, same-width int
# dtype to view the bits through). Order is the enum's.
DTYPES = [
    ("kFloat32", torch.float32, 32, torch.int32),
    ("kFloat64", torch.float64, 64, torch.int64),
    ("kFloat16", torch.float16, 16, torch.int16),
    ("kBFloat16", torch.bfloat16, 16, torch.int16),
    ("kInt8", torch.int8, 8, torch.int8),
    ("kInt16", torch.int16, 16, torch.int16),
    ("kInt32", torch.int32, 32, torch.int32),
    ("kInt64", torch.int64, 64, torch.int64),
    ("kUInt8", torch.uint8, 8, torch.uint8),
    ("kBool", torch.bool, 8, torch.uint8),
]
INT_RANGES = {
    "kInt8": (-(2**7), 2**7 - 1),
    "kInt16": (-(2**15), 2**15 - 1),
    "kInt32": (-(2**31), 2**31 - 1),
    "kInt64": (-(2**63), 2**63 - 1),
    # c10 converts floating -> uint8 through int64.
    "kUInt8": (-(2**63), 2**63 - 1),
}


def f32_bits(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def f64_bits(x):
    return int(np.array([x], dtype=np.float64).view(np.uint64)[0])


def int_bits(x, width):
    return x & ((1 << width) - 1)


FLOAT_VALUES = [
    0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.75, 2.5, -2.5, 3.5, 2.7, -2.7, 0.1,
    -3.7, 127.0, 127.9, 128.0, -128.0, -128.9, -129.0, 200.0, 255.0, 255.9,
    256.0, 300.5, -255.0, -256.5, 1000.25, 2049.0, 32767.0, 32768.0,
    -32769.0, 65504.0, 65519.0, 65520.0, -65520.0, 16777217.0, 2147483520.0,
    -2147483648.0, 1e10, -1e10, 1e20, -1e20, 3e38, -3e38, 1e-8, 5.9604645e-08,
    2.0**-25, 2.0**-25 * 1.5, 2.0**-14, 2.0**-24 * 1023, 1e-40, 1 + 2.0**-11,
    1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-23, 1 + 2.0**-8,
    1 + 2.0**-8 + 2.0**-23, 1 + 3 * 2.0**-8, 65535.0, 3.3895314e38,
    math.inf, -math.inf,
]
FLOAT32_BITS = [f32_bits(v) for v in FLOAT_VALUES] + [
    0x7FC00000, 0xFFC00000, 0x7F812345, 0xFFFFFFFF, 0x7F800001, 0x00000001,
    0x80000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F808000, 0x3F818000, 0x477FEFFF,
]
FLOAT64_BITS = [f64_bits(v) for v in FLOAT_VALUES] + [
    f64_bits(v) for v in [
        1 + 2.0**-11 + 2.0**-40,  # float16 double rounding: 1.0 via float32
        1 + 2.0**-8 + 2.0**-40,  # bfloat16 double rounding
        1e300, -1e300, 1e-300, 3.4028235677973366e38, 3.4028235677973362e38,
        2.0**63, -(2.0**63), 9.2e18, -9.2e18, 4294967296.5, -4294967297.5,
        2.0**53 + 1, 0.1, 1 / 3,
    ]
] + [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
     0x7FF4000000000123, 0x0000000000000001]
FLOAT16_BITS = [
    0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3555, 0x3800, 0x3C00,
    0xBC00, 0x3C01, 0x4170, 0xC170, 0x4100, 0x57F0, 0x5800, 0xD808, 0x5BFF,
    0x5C00, 0x5C01, 0x6800, 0x6801, 0x7800, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
    0x7E00, 0xFE00, 0x7C01, 0x7D55, 0xFFFF,
]
BFLOAT16_BITS = [
    0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x3F81,
    0x402D, 0xC02D, 0x4300, 0x42FF, 0x4301, 0xC301, 0x437F, 0x4380, 0x4381,
    0x4700, 0x477F, 0x4780, 0x4F00, 0xCF00, 0x5EFF, 0x5F00, 0xDF00, 0x7F7F,
    0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x3DCD, 0x3380,
    0x3381,
]
INT_VALUES = {
    "kInt8": [-128, -127, -1, 0, 1, 2, 100, 127],
    "kInt16": [-32768, -129, -128, -1, 0, 1, 127, 128, 255, 256, 257, 2049,
               2051, 32767],
    "kInt32": [-(2**31), -(2**31) + 1, -65520, -65519, -257, -1, 0, 1, 255,
               256, 2049, 65504, 65519, 65520, 16777217, 16777219,
               2**31 - 128, 2**31 - 1],
    "kInt64": [-(2**63), -(2**63) + 1, -(2**31) - 1, -1, 0, 1, 255, 256,
               65520, 16777217, 2**31, 2**31 + 2**23 + 1, 2**32 + 5,
               2**40 + 0x181, 2**53 + 1, 2**62 + 2**38, 2**63 - 1],
    "kUInt8": [0, 1, 2, 127, 128, 200, 255],
    "kBool": [0, 1],
}


def source_bits(name, width):
    if name == "kFloat32":
        return FLOAT32_BITS
    if name == "kFloat64":
        return FLOAT64_BITS
    if name == "kFloat16":
        return FLOAT16_BITS
    if name == "kBFloat16":
        return BFLOAT16_BITS
    return [int_bits(v, width) for v in INT_VALUES[name]]


def to_signed(bits, width):
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def make_tensor(bits, tdtype, width, view_dtype):
    if tdtype == torch.bool:
        return torch.tensor([b != 0 for b in bits], dtype=torch.bool)
    signed = view_dtype != torch.uint8
    raw = [to_signed(b, width) if signed else b for b in bits]
    return torch.tensor(raw, dtype=view_dtype).view(tdtype)


def tensor_bits(t, width, view_dtype):
    return [int(v) & ((1 << width) - 1)
            for v in t.contiguous().view(view_dtype).tolist()]


def defined_in_torch(src_name, value, dst_name):
    """False for the floating -> integer cases C++ leaves undefined."""
    if dst_name not in INT_RANGES or src_name not in (
            "kFloat32", "kFloat64", "kFloat16", "kBFloat16"):
        return True
    if math.isnan(value) or math.isinf(value):
        return False
    low, high = INT_RANGES[dst_name]
    return low <= math.trunc(value) <= high


def compute_rows():
    rows = []
    for src_name, src_dtype, src_width, src_view in DTYPES:
        bits = source_bits(src_name, src_width)
        src = make_tensor(bits, src_dtype, src_width, src_view)
        # Exact values for the undefined-case filter (float16/bfloat16 and
        # float32 widen exactly to float64).
        values = src.to(torch.float64).tolist()
        for dst_name, dst_dtype, dst_width, dst_view in DTYPES:
            keep = [i for i, v in enumerate(values)
                    if defined_in_torch(src_name, v, dst_name)]
            # One contiguous copy over the kept elements, as ConvertElements.
            out = src[keep].contiguous().to(dst_dtype)
            out_bits = tensor_bits(out, dst_width, dst_view)
            for i, ob in zip(keep, out_bits):
                rows.append((src_name, dst_name, bits[i], ob))
    return rows


def hex_literal(value):
    return "0x%XULL" % value


def main():
    if "--dump-json" in sys.argv:
        json.dump(compute_rows(), sys.stdout)
        return
    rows = compute_rows()
    # Same rows on the CPU's own kernels (environment without the override).
    env = dict(os.environ)
    env.pop(CAPABILITY_ENV, None)
    native = json.loads(subprocess.run(
        [sys.executable, __file__, "--dump-json"], env=env, check=True,
        capture_output=True, text=True).stdout)
    native = [tuple(r) for r in native]
    assert len(native) == len(rows), "native run produced other rows"
    differences = []
    for ours, theirs in zip(rows, native):
        assert ours[:3] == theirs[:3], (ours, theirs)
        if ours[3] != theirs[3]:
            src_name, dst_name, src_bits, _ = ours
            is_nan = ((src_name == "kFloat32" and
                       (src_bits & 0x7FFFFFFF) > 0x7F800000) or
                      (src_name == "kFloat64" and
                       (src_bits & 0x7FFFFFFFFFFFFFFF) > 0x7FF0000000000000))
            assert dst_name == "kBFloat16" and is_nan, (
                "unexpected kernel difference", ours, theirs)
            differences.append((ours, theirs[3]))

    out_path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "dtype_vectors.inc")
    with open(out_path, "w") as f:
        f.write("// Generated by tests/core/make_dtype_vectors.py with torch "
                "%s (CPU, ATEN_CPU_CAPABILITY=default).\n" % torch.__version__)
        f.write("// Do not edit; rerun the script. Rows: {source dtype, "
                "destination dtype,\n// source bits, expected bits}.\n")
        f.write("// With the CPU's own kernels torch differs in %d rows, all "
                "NaN -> bfloat16,\n// where it writes 0xFFFF (modelstate "
                "uses 0x7FC0):\n" % len(differences))
        for ours, native_bits in differences:
            f.write("//   %s %s -> 0x%X\n" % (ours[0], hex(ours[2]),
                                             native_bits))
        f.write("// clang-format off\n")
        for src_name, dst_name, src_bits, dst_bits in rows:
            f.write("{DType::%s, DType::%s, %s, %s},\n" % (
                src_name, dst_name, hex_literal(src_bits),
                hex_literal(dst_bits)))
        f.write("// clang-format on\n")
    print("wrote %d rows to %s (%d native-kernel differences)" % (
        len(rows), out_path, len(differences)))


if __name__ == "__main__":
    main()
