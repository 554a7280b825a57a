#!/usr/bin/env python3
"""Checks modelstate's safetensors files against an independent implementation.

Debian 12 ships no python3-safetensors, so this script carries its own small
reader and writer (struct + json + numpy, written from the format description)
and uses PyTorch for the values:

1. safetensors_tool write-sample: the file modelstate writes must pass this
   reader's checks and hold exactly the values torch gives for the sample.
2. Files written here from torch tensors (every dtype modelstate has, 0-dim
   and empty tensors, JSON order different from data order, with and without
   padding) must load in modelstate with the same keys, dtypes, shapes and
   bytes, and `safetensors_tool copy` must write them back unchanged.
3. A malformed file must be rejected by modelstate.

Usage: safetensors_interop.py PATH/TO/safetensors_tool
"""

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

# safetensors dtype name -> (torch dtype, numpy dtype with the same bytes).
# numpy has no bfloat16: its bytes travel as int16 and are viewed in torch.
DTYPES = {
    "F64": (torch.float64, np.float64),
    "F32": (torch.float32, np.float32),
    "F16": (torch.float16, np.float16),
    "BF16": (torch.bfloat16, np.int16),
    "I64": (torch.int64, np.int64),
    "I32": (torch.int32, np.int32),
    "I16": (torch.int16, np.int16),
    "I8": (torch.int8, np.int8),
    "U8": (torch.uint8, np.uint8),
    "BOOL": (torch.bool, np.bool_),
}
TORCH_TO_NAME = {torch_dtype: name for name, (torch_dtype, _) in DTYPES.items()}


class FormatError(Exception):
    pass


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def read_safetensors(path):
    """Returns (header bytes, metadata dict, [(key, tensor)] in data order)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError("shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise FormatError(f"header length {n} exceeds the file")
    header_bytes = blob[8:8 + n]

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise FormatError(f"duplicate keys in {keys}")
        return dict(pairs)  # Keeps the file's order.

    header = json.loads(header_bytes.decode("utf-8"),
                        object_pairs_hook=no_duplicates)
    if not isinstance(header, dict):
        raise FormatError("header is not an object")
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str)
               for k, v in metadata.items()):
        raise FormatError("metadata is not string -> string")
    data = blob[8 + n:]
    # sorted() is stable: zero-byte tensors at one offset keep JSON order.
    entries = sorted(header.items(),
                     key=lambda kv: tuple(kv[1]["data_offsets"]))
    out = []
    pos = 0
    for key, info in entries:
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"{key}: fields {sorted(info)}")
        torch_dtype, np_dtype = DTYPES[info["dtype"]]
        shape = info["shape"]
        begin, end = info["data_offsets"]
        if begin != pos:
            raise FormatError(f"{key}: begins at {begin}, expected {pos}")
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * np.dtype(np_dtype).itemsize:
            raise FormatError(f"{key}: [{begin}, {end}] does not fit {shape}")
        if count == 0:
            array = np.empty(shape, dtype=np_dtype)
        else:
            array = np.frombuffer(data, dtype=np_dtype, count=count,
                                  offset=begin).reshape(shape).copy()
        t = torch.from_numpy(array)
        if torch_dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out.append((key, t))
        pos = end
    if pos != len(data):
        raise FormatError(f"tensors cover {pos} of {len(data)} data bytes")
    return header_bytes, metadata, out


def write_safetensors(path, tensors, metadata=None, data_order=None,
                      json_order=None, pad=True, indent=None):
    """Writes [(key, tensor)] with data in `data_order` and JSON keys in
    `json_order` (both lists of keys; default: the given order)."""
    by_key = dict(tensors)
    data_order = data_order or [k for k, _ in tensors]
    json_order = json_order or [k for k, _ in tensors]
    infos = {}
    chunks = []
    offset = 0
    for key in data_order:
        t = by_key[key]
        b = tensor_bytes(t)
        infos[key] = {"dtype": TORCH_TO_NAME[t.dtype], "shape": list(t.shape),
                      "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    header = {k: infos[k] for k in json_order}
    if metadata:
        header["__metadata__"] = metadata  # Last, unlike the reference.
    text = json.dumps(header, indent=indent).encode("utf-8")
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in chunks:
            f.write(b)


def run_tool(tool, *args):
    proc = subprocess.run([tool, *args], capture_output=True, text=True,
                          check=False)
    out = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, out, proc.stderr


# The values safetensors_tool.cc's SampleStateDict() holds, in its order.
SAMPLE = [
    ("layer.weight", torch.float32, (2, 3),
     [0.5, -1.25, 3.0, 0.001, -0.0, 65504.0]),
    ("layer.bias", torch.float64, (3,), [1.0 / 3.0, -2.5, 1e100]),
    ("half", torch.float16, (4,), [1.0, -2.0, 0.333251953125, 65504.0]),
    ("brain", torch.bfloat16, (2, 2), [1.0, -3.5, 0.0078125, 256.0]),
    ("i8", torch.int8, (3,), [-128, 0, 127]),
    ("i16", torch.int16, (2,), [-32768, 12345]),
    ("i32", torch.int32, (2,), [-7, 2147483647]),
    ("i64", torch.int64, (2,), [-9007199254740992, 42]),
    ("u8", torch.uint8, (3,), [0, 200, 255]),
    ("mask", torch.bool, (2, 2), [True, False, False, True]),
    ("scalar", torch.float32, (), [2.5]),
    ("empty", torch.float32, (0, 3), []),
    ("a.last", torch.int64, (1,), [-1]),
]


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def check_modelstate_file_reads_here(tool, tmp):
    path = os.path.join(tmp, "sample.safetensors")
    rc, out, err = run_tool(tool, "write-sample", path)
    expect(rc == 0, f"write-sample failed: {out} {err}")
    header_bytes, metadata, tensors = read_safetensors(path)
    expect((8 + len(header_bytes)) % 8 == 0, "header not padded to 8")
    expect(header_bytes == header_bytes.lstrip(), "header has leading spaces")
    expect(metadata == {"format": "pt", "writer": "modelstate"},
           f"metadata {metadata}")
    json_keys = list(json.loads(header_bytes))
    expect(json_keys == ["__metadata__"] + [s[0] for s in SAMPLE],
           f"JSON key order {json_keys}")
    expect([k for k, _ in tensors] == [s[0] for s in SAMPLE],
           f"data order {[k for k, _ in tensors]}")
    for (key, t), (want_key, dtype, shape, values) in zip(tensors, SAMPLE):
        want = torch.tensor(values, dtype=dtype).reshape(shape)
        expect(t.dtype == dtype, f"{key}: dtype {t.dtype}, want {dtype}")
        expect(tuple(t.shape) == shape, f"{key}: shape {tuple(t.shape)}")
        # Bytes, not values: -0.0 and every rounding must match too.
        expect(tensor_bytes(t) == tensor_bytes(want),
               f"{key}: {t} != {want}")
    return len(tensors)


def torch_sample():
    """Tensors of every dtype modelstate has, from torch's generator."""
    g = torch.Generator().manual_seed(7)
    out = [
        ("enc.weight", torch.randn(3, 5, generator=g)),
        ("enc.weight_bf16", torch.randn(4, 3, generator=g).to(torch.bfloat16)),
        ("enc.half", torch.randn(7, generator=g).to(torch.float16)),
        ("mask", torch.rand(3, 3, generator=g) > 0.5),
        ("int8", torch.randint(-128, 128, (9,), generator=g, dtype=torch.int8)),
        ("double", torch.randn(2, 2, generator=g, dtype=torch.float64)),
        ("int16", torch.randint(-32768, 32768, (3,), generator=g,
                                dtype=torch.int16)),
        ("int32", torch.randint(-2**31, 2**31, (1, 3), generator=g,
                                dtype=torch.int32)),
        ("steps", torch.tensor(123456789012, dtype=torch.int64)),  # 0-dim
        ("bytes", torch.randint(0, 256, (5,), generator=g, dtype=torch.uint8)),
        ("nothing", torch.zeros(0, 4, dtype=torch.bfloat16)),
        ("flag", torch.tensor(True)),
    ]
    return out


def check_files_from_here_read_in_modelstate(tool, tmp):
    tensors = torch_sample()
    keys = [k for k, _ in tensors]
    # The reference writer's layout: larger elements first, then by name.
    data_order = sorted(keys, key=lambda k: (-dict(tensors)[k].element_size(),
                                             k))
    variants = [
        ("padded", dict(pad=True)),
        ("unpadded", dict(pad=False)),
        ("indented", dict(pad=False, indent=2)),
    ]
    for name, options in variants:
        path = os.path.join(tmp, f"torch_{name}.safetensors")
        write_safetensors(path, tensors, metadata={"format": "pt",
                                                   "variant": name},
                          data_order=data_order, json_order=sorted(keys),
                          **options)
        rc, out, err = run_tool(tool, "dump", path)
        expect(rc == 0, f"{name}: dump failed: {out} {err}")
        expect(out["metadata"] == [["format", "pt"], ["variant", name]],
               f"{name}: metadata {out['metadata']}")
        got_keys = [t["key"] for t in out["tensors"]]
        expect(got_keys == data_order, f"{name}: order {got_keys}")
        by_key = dict(tensors)
        for entry in out["tensors"]:
            t = by_key[entry["key"]]
            expect(entry["dtype"] == TORCH_TO_NAME[t.dtype],
                   f"{name}: {entry}")
            expect(entry["shape"] == list(t.shape), f"{name}: {entry}")
            expect(entry["sha256"] == hashlib.sha256(tensor_bytes(t))
                   .hexdigest(), f"{name}: bytes of {entry['key']}")

        # Read by modelstate, written again, read here: nothing changes.
        copy = os.path.join(tmp, f"copy_{name}.safetensors")
        rc, out, err = run_tool(tool, "copy", path, copy)
        expect(rc == 0, f"{name}: copy failed: {out} {err}")
        header_bytes, metadata, back = read_safetensors(copy)
        expect(metadata == {"format": "pt", "variant": name},
               f"{name}: copied metadata {metadata}")
        expect(list(json.loads(header_bytes))[1:] == data_order,
               f"{name}: copied JSON order")
        expect([k for k, _ in back] == data_order, f"{name}: copied order")
        for key, t in back:
            want = by_key[key]
            expect(t.dtype == want.dtype and t.shape == want.shape and
                   tensor_bytes(t) == tensor_bytes(want),
                   f"{name}: copied {key}")
    return len(variants)


def check_malformed_file_is_rejected(tool, tmp):
    path = os.path.join(tmp, "overlap.safetensors")
    header = json.dumps({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
    }).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(8))
    rc, out, _ = run_tool(tool, "dump", path)
    expect(rc == 1 and "overlap" in out["error"], f"accepted: {out}")
    return 1


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tool = sys.argv[1]
    checks = [check_modelstate_file_reads_here,
              check_files_from_here_read_in_modelstate,
              check_malformed_file_is_rejected]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for check in checks:
            try:
                count = check(tool, tmp)
                print(f"ok   {check.__name__} ({count})")
                passed += 1
            except Exception as e:  # pylint: disable=broad-except
                print(f"FAIL {check.__name__}: {e!r}")
                failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
