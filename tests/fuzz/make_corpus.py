#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/.

    /usr/bin/python3 tests/fuzz/make_corpus.py

Needs protoc and python3-protobuf (Debian's): the protos are compiled into a
temporary directory, so that binary specs and state streams are encoded by
protobuf itself. Safetensors files are written by hand, byte by byte, after
the format's description (an 8-byte little-endian header length, the JSON
header, the data), so that the reader is seeded by a writer other than its
own. The output is deterministic; rerun it after changing the seeds.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def load_protos(tmp):
    """Compiles modelstate/v1/*.proto for Python; returns the modules."""
    proto_dir = os.path.join(ROOT, "proto")
    names = ["tensor", "module", "model_state_service"]
    subprocess.run(
        ["protoc", "-I", proto_dir, "--python_out", tmp] +
        [os.path.join(proto_dir, "modelstate/v1/%s.proto" % n) for n in names],
        check=True)
    sys.path.insert(0, tmp)
    from modelstate.v1 import model_state_service_pb2  # noqa: E402
    from modelstate.v1 import tensor_pb2  # noqa: E402
    from google.protobuf import json_format  # noqa: E402
    return model_state_service_pb2, tensor_pb2, json_format


def write(target, name, data):
    path = os.path.join(CORPUS, target, name)
    with open(path, "wb") as f:
        f.write(data)


# ----------------------------------------------------------------- safetensors

ST_DTYPES = {  # safetensors name: (struct format, element size)
    "F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "BF16": ("H", 2),
    "I64": ("q", 8), "I32": ("i", 4), "I16": ("h", 2), "I8": ("b", 1),
    "U8": ("B", 1), "BOOL": ("?", 1),
}


def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (key, dtype, shape, values); returns the file."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for key, dtype, shape, values in tensors:
        fmt, size = ST_DTYPES[dtype]
        raw = struct.pack("<%d%s" % (len(values), fmt), *values)
        count = 1
        for d in shape:
            count *= d
        assert len(raw) == count * size, key
        header[key] = {"dtype": dtype, "shape": shape,
                       "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:  # as the reference writer: data 8-aligned in the file
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def make_safetensors():
    write("safetensors_fuzz", "empty", safetensors([]))
    write("safetensors_fuzz", "metadata_only",
          safetensors([], {"format": "pt", "note": "caf\u00e9"}))
    write("safetensors_fuzz", "linear", safetensors(
        [("weight", "F32", [2, 3], [0.5, -1.0, 2.0, 3.25, 0.0, -0.0]),
         ("bias", "F32", [2], [1.0, -1.0])], {"format": "pt"}))
    write("safetensors_fuzz", "all_dtypes", safetensors([
        ("f64", "F64", [2], [1.5, -2.5]),
        ("f16", "F16", [3], [1.0, 65504.0, -0.5]),
        ("bf16", "BF16", [2], [0x3F80, 0xC000]),
        ("i64", "I64", [1], [-(2 ** 62)]),
        ("i32", "I32", [2, 1], [7, -7]),
        ("i16", "I16", [1], [-300]),
        ("i8", "I8", [3], [-128, 0, 127]),
        ("u8", "U8", [2], [0, 255]),
        ("bool", "BOOL", [2], [True, False]),
        ("scalar", "F32", [], [42.0]),
        ("empty", "F32", [0, 4], []),
    ]))
    # Unpadded, keys not in data order, a zero-size tensor between others.
    write("safetensors_fuzz", "unordered", safetensors(
        [("z.b", "I8", [2], [1, 2]), ("a.w", "F16", [0], []),
         ("m.x", "U8", [1], [9])], pad=False))


# ------------------------------------------------------------------ spec JSON

LAYERS = [
    {"type": "Linear", "args": [3, 2]},
    {"type": "Linear", "args": [3, 2], "kwargs": {"bias": False}},
    {"type": "Bilinear", "args": [3, 4, 2]},
    {"type": "Conv1d", "args": [2, 4, 3]},
    {"type": "Conv2d", "args": [2, 4, 3],
     "kwargs": {"stride": 2, "padding": 1, "bias": False}},
    {"type": "ConvTranspose2d", "args": [2, 4, 3]},
    {"type": "BatchNorm1d", "args": [3]},
    {"type": "BatchNorm2d", "args": [3], "kwargs": {"affine": False}},
    {"type": "LayerNorm", "args": [[2, 3]]},
    {"type": "GroupNorm", "args": [2, 4]},
    {"type": "Embedding", "args": [5, 3], "kwargs": {"padding_idx": 0}},
    {"type": "Dropout", "args": [0.25]},
    {"type": "ReLU", "kwargs": {"inplace": True}},
    {"type": "GELU", "kwargs": {"approximate": "tanh"}},
    {"type": "Softmax", "kwargs": {"dim": 1}},
    {"type": "Flatten"},
    {"type": "MaxPool2d", "args": [3, 2, 1]},
    {"type": "AdaptiveAvgPool2d", "args": [[1, 1]]},
    {"type": "MultiheadAttention", "args": [4, 2]},
    {"type": "TransformerEncoderLayer", "args": [4, 2, 8]},
    {"type": "LSTM", "args": [3, 4, 2],
     "kwargs": {"bidirectional": True, "proj_size": 2}},
    {"type": "GRU", "args": [3, 4], "kwargs": {"batch_first": True}},
    {"type": "RNN", "args": [3, 4], "kwargs": {"nonlinearity": "relu"}},
    {"type": "LSTMCell", "args": [3, 4]},
    {"type": "GRUCell", "args": [3, 4], "kwargs": {"bias": False}},
    {"type": "RNNCell", "args": [3, 4]},
    # An explicit empty custom module, and a type no one knows.
    {"type": "Empty", "custom": True},
    {"type": "Linaer", "args": [3, 2]},
    # Issue 18's other layers.
    {"type": "Conv3d", "args": [2, 4, [1, 2, 3]], "kwargs": {"groups": 2}},
    {"type": "ConvTranspose1d", "args": [2, 4, 3], "kwargs": {"stride": 2}},
    {"type": "EmbeddingBag", "args": [10, 3],
     "kwargs": {"mode": "max", "padding_idx": -1}},
    {"type": "InstanceNorm2d", "args": [3],
     "kwargs": {"affine": True, "track_running_stats": True}},
    {"type": "PReLU", "args": [4]},
    {"type": "ReflectionPad2d", "args": [[1, 0, 2, 1]]},
    {"type": "TransformerDecoderLayer", "args": [4, 2, 8]},
    {"type": "Transformer", "args": [4, 2, 1, 1, 8]},
    # Pooling in 1-3 d, channel and alpha dropout, Unflatten, pixel shuffle.
    {"type": "MaxPool1d", "args": [3, 2, 1], "kwargs": {"ceil_mode": True}},
    {"type": "MaxPool3d", "args": [[2, 3, 2]],
     "kwargs": {"return_indices": True, "dilation": 2}},
    {"type": "AvgPool1d", "args": [4, 3, 2, True, False]},
    {"type": "AvgPool2d", "args": [3, 2, 1], "kwargs": {"divisor_override": 5}},
    {"type": "AvgPool3d", "args": [[2, 1, 2]],
     "kwargs": {"padding": [1, 0, 1], "count_include_pad": False}},
    {"type": "AdaptiveAvgPool1d", "args": [4]},
    {"type": "AdaptiveAvgPool3d", "args": [[2, 3, 1]]},
    {"type": "AdaptiveMaxPool1d", "args": [3, True]},
    {"type": "AdaptiveMaxPool2d", "args": [[3, 2]]},
    {"type": "AdaptiveMaxPool3d", "args": [2], "kwargs": {"return_indices": True}},
    {"type": "Dropout1d", "args": [0.5]},
    {"type": "Dropout2d", "kwargs": {"p": 0.1, "inplace": True}},
    {"type": "Dropout3d", "args": [0.3]},
    {"type": "AlphaDropout", "args": [0.2]},
    {"type": "Unflatten", "args": [1, [2, -1, 3]]},
    {"type": "PixelShuffle", "args": [2]},
    {"type": "PixelUnshuffle", "args": [3]},
    # The upsampling family: sizes, float scales and their tuples.
    {"type": "Upsample", "kwargs": {"scale_factor": 2, "mode": "bilinear"}},
    {"type": "Upsample", "args": [None, [1.5, 2, 0.7], "trilinear", True]},
    {"type": "Upsample", "args": [[9, 4]],
     "kwargs": {"mode": "nearest-exact"}},
    {"type": "Upsample", "args": [None, 2.5],
     "kwargs": {"mode": "area", "recompute_scale_factor": True}},
    {"type": "UpsamplingNearest2d", "args": [4]},
    {"type": "UpsamplingBilinear2d", "kwargs": {"scale_factor": 1.5}},
    # Issue 18's last layers: activations with arguments, feature alpha
    # dropout, channel shuffle, local response norm and the distances.
    {"type": "ReLU6", "kwargs": {"inplace": True}},
    {"type": "Hardtanh", "args": [-2.0, 2.5], "kwargs": {"max_value": 3}},
    {"type": "SELU"},
    {"type": "CELU", "args": [0.5]},
    {"type": "GLU", "args": [1]},
    {"type": "LogSigmoid"},
    {"type": "Softmin", "kwargs": {"dim": -1}},
    {"type": "Softsign"},
    {"type": "Softshrink", "args": [0.25]},
    {"type": "Hardshrink", "kwargs": {"lambd": 1}},
    {"type": "Tanhshrink"},
    {"type": "Threshold", "args": [0.1, 20, False]},
    {"type": "Softmax2d"},
    {"type": "FeatureAlphaDropout", "args": [0.3]},
    {"type": "ChannelShuffle", "args": [4]},
    {"type": "LocalResponseNorm", "args": [5, 1e-3, 0.5, 2]},
    {"type": "PairwiseDistance", "kwargs": {"p": 1, "keepdim": True}},
    {"type": "CosineSimilarity", "args": [0, 1e-6]},
    {"type": "LPPool1d", "args": [2, 3], "kwargs": {"ceil_mode": True}},
    {"type": "LPPool2d", "args": [1.5, [2, 3], 1]},
    {"type": "Fold", "args": [[6, 5], [2, 3]], "kwargs": {"padding": 1}},
    {"type": "Unfold", "args": [3, 2, 1, [2, 1]]},
]

CUSTOM = {
    "type": "Net", "extra_state": True, "members": [
        {"module": {"name": "embed",
                    "spec": {"type": "Embedding", "args": [10, 4]}}},
        {"module": {"name": "proj", "spec": {
            "type": "Linear", "args": [4, 10], "kwargs": {"bias": False}}}},
        {"parameter": {"name": "scale", "shape": [2],
                       "init": {"kind": "uniform", "a": -1, "b": 1}}},
        {"parameter": {"name": "frozen", "shape": [1], "dtype": "float64",
                       "requires_grad": False,
                       "init": {"kind": "normal", "seed": 7}}},
        {"parameter": {"name": "gone", "none": True}},
        {"buffer": {"name": "steps", "shape": [], "dtype": "int64"}},
        {"buffer": {"name": "mask", "shape": [2], "dtype": "bool",
                    "persistent": False, "init": {"kind": "ones"}}},
        {"buffer": {"name": "table", "data": {
            "dtype": "DTYPE_INT16", "shape": [2],
            "data": "AQACAA=="}}},  # int16 [1, 2]
        {"buffer": {"name": "k", "shape": [3, 2],
                    "init": {"kind": "kaiming_uniform", "a": 2.2360679}}},
        {"buffer": {"name": "x", "shape": [2, 2],
                    "init": {"kind": "xavier_normal", "a": 1.0}}},
        {"module": {"name": "none_child", "none": True}},
        {"module": {"name": "seq", "spec": {"type": "Sequential", "children": [
            {"spec": {"type": "Linear", "args": [2, 2]}},
            {"spec": {"ref": "0"}}]}}},
        {"module": {"name": "dict", "spec": {
            "type": "ModuleDict", "children": [
                {"name": "a", "spec": {"type": "Tanh"}},
                {"name": "b", "spec": {"type": "ModuleList", "children": [
                    {"spec": {"type": "SiLU"}},
                    {"spec": {"type": "Identity"}}]}}]}}},
    ],
    "ties": [{"target": "proj.weight", "source": "embed.weight"}],
}


def spec_inputs():
    """(name, JSON document) pairs: bare specs and whole requests."""
    out = [("layer_%02d_%s" % (i, s["type"]), s) for i, s in enumerate(LAYERS)]
    out.append(("custom", CUSTOM))
    out.append(("request_meta", {
        "module": "team/net", "seed": "3", "device": "meta",
        "dtype": "bfloat16", "spec": CUSTOM}))
    out.append(("request_cpu_f64", {
        "module": "mlp", "seed": "1", "dtype": "torch.float64",
        "all_or_nothing": True,
        "spec": {"type": "Sequential", "children": [
            {"spec": {"type": "Linear", "args": [4, 8]}},
            {"spec": {"type": "ReLU"}},
            {"spec": {"type": "Linear", "args": [8, 2]}}]}}))
    # The README's MLP is over the fuzz build limits on cpu: meta.
    with open(os.path.join(ROOT, "tests/bench/models/mlp.json")) as f:
        out.append(("bench_mlp_meta", {"device": "meta",
                                       "spec": json.load(f)}))
    return out


def make_specs(pb2, json_format):
    for name, doc in spec_inputs():
        text = json.dumps(doc, indent=1).encode()
        # First byte odd: JSON, as modelstatectl reads a spec file.
        write("spec_fuzz", name + ".json", b"1" + text)
        # First byte even: the binary request the server receives.
        request = pb2.BuildModuleRequest()
        if "spec" in doc:
            json_format.Parse(json.dumps(doc), request)
        else:
            json_format.Parse(json.dumps(doc), request.spec)
        write("spec_fuzz", name + ".bin",
              b"0" + request.SerializeToString(deterministic=True))


# --------------------------------------------------------------- state streams

def varint(n):
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def stream(pb2, tensor_pb2, mode, entries, metadata, chunk_sizes):
    """A framed stream: mode byte, header chunk, data in chunk_sizes pieces.

    entries: list of (key, DTYPE_*, shape, bytes)."""
    header = pb2.StateDictChunk()
    data = b""
    for key, dtype, shape, raw in entries:
        e = header.header.entries.add()
        e.key = key
        e.dtype = tensor_pb2.DType.Value(dtype)
        e.shape.extend(shape)
        e.byte_length = len(raw)
        data += raw
    for path, version in metadata:
        m = header.header.metadata.add()
        m.path = path
        m.version = version
    header.header.total_bytes = len(data)
    frames = [header.SerializeToString()]
    pos = 0
    i = 0
    while pos < len(data):
        size = chunk_sizes[i % len(chunk_sizes)]
        chunk = pb2.StateDictChunk()
        chunk.data = data[pos:pos + size]
        frames.append(chunk.SerializeToString())
        pos += size
        i += 1
    return bytes([mode]) + b"".join(varint(len(f)) + f for f in frames)


def make_streams(pb2, tensor_pb2):
    linear = [
        ("weight", "DTYPE_FLOAT32", [2, 3], struct.pack("<6f", *range(6))),
        ("bias", "DTYPE_FLOAT32", [2], struct.pack("<2f", 0.5, -0.5)),
    ]
    mixed = [
        ("bn.weight", "DTYPE_FLOAT16", [3], struct.pack("<3e", 1, 2, 3)),
        ("bn.num_batches_tracked", "DTYPE_INT64", [], struct.pack("<q", 5)),
        ("empty", "DTYPE_FLOAT32", [0, 3], b""),
        ("mask", "DTYPE_BOOL", [2], b"\x01\x00"),
        ("bf", "DTYPE_BFLOAT16", [2], struct.pack("<2H", 0x3F80, 0x4000)),
        ("d", "DTYPE_FLOAT64", [1], struct.pack("<d", -1.25)),
        ("i8", "DTYPE_INT8", [2], b"\x80\x7f"),
        ("u8", "DTYPE_UINT8", [1], b"\xff"),
        ("i16", "DTYPE_INT16", [1], struct.pack("<h", -2)),
        ("i32", "DTYPE_INT32", [1], struct.pack("<i", 1 << 20)),
        ("tail", "DTYPE_FLOAT32", [0], b""),
    ]
    meta = [("", 1), ("bn", 2)]
    # Mode byte % 3: 0 in memory, 1 staged anonymous, 2 staged file;
    # mode / 3 picks the dtype CopyInto converts to (float32 first).
    for mode, name in [(0, "memory"), (1, "staged"), (2, "file")]:
        write("stream_fuzz", "linear_" + name,
              stream(pb2, tensor_pb2, mode, linear, [], [1 << 20]))
        write("stream_fuzz", "mixed_small_chunks_" + name,
              stream(pb2, tensor_pb2, mode, mixed, meta, [1, 3, 7]))
    write("stream_fuzz", "mixed_to_f16",
          stream(pb2, tensor_pb2, 3 * 2 + 1, mixed, meta, [5]))
    write("stream_fuzz", "header_only",
          stream(pb2, tensor_pb2, 0, [], meta, [1]))


# ------------------------------------------------------------------ predicate

def attestation_predicate(records, build_seq=None):
    """A SLSA predicate as service/attestation.cc writes one: records is a
    list of (seq, type); build_seq the build record's seq, if any."""
    import base64
    import hashlib
    note = ("modelstate.example/log\n%d\n%s\n\n\u2014 modelstate AAAA\n"
            % (max(s for s, _ in records),
               base64.b64encode(hashlib.sha256(b"root").digest()).decode()))
    external = {"module": "team/mlp", "changes": []}
    if build_seq is not None:
        external["build"] = {"type": "Linear", "spec": {"type": "Linear",
                             "args": [4, 3]}, "seed": 7, "seq": build_seq}
    cited = [{"seq": seq, "type": kind, "outcome": "ok",
              "identity": "alice",
              "leaf_hash": hashlib.sha256(b"record %d" % seq).hexdigest()}
             for seq, kind in records]
    return {
        "buildDefinition": {
            "buildType": "https://modelstate.dev/attestation/build/v1",
            "externalParameters": external,
            "resolvedDependencies": []},
        "runDetails": {
            "builder": {"id": "urn:modelstate:log:key",
                        "version": {"modelstate": "1"}},
            "metadata": {},
            "byproducts": [
                {"name": "audit-checkpoint",
                 "mediaType": "text/plain; charset=utf-8",
                 "content": base64.b64encode(note.encode()).decode(),
                 "annotations": {"verifier_key": "key"}},
                {"name": "audit-records",
                 "digest": {"sha256": hashlib.sha256(b"d").hexdigest()},
                 "annotations": {"records": cited}},
                {"name": "participants",
                 "uri": "urn:modelstate:participants",
                 "annotations": {"identities": ["alice"],
                                 "subscribers": []}}]}}


def make_predicates():
    built = attestation_predicate(
        [(3, "build"), (5, "load_state_dict"), (9, "move")], build_seq=3)
    moved = attestation_predicate([(12, "move_in"), (14, "set_training")])
    write("predicate_fuzz", "built.json",
          json.dumps(built, sort_keys=True).encode())
    write("predicate_fuzz", "moved.json",
          json.dumps(moved, sort_keys=True).encode())
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "weight",
                     "digest": {"sha256": "ab" * 32},
                     "annotations": {"dtype": "float32", "shape": [3, 4]}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": built}
    write("predicate_fuzz", "statement.json",
          json.dumps(statement, sort_keys=True).encode())


def main():
    for target in ["safetensors_fuzz", "spec_fuzz", "stream_fuzz",
                   "predicate_fuzz"]:
        shutil.rmtree(os.path.join(CORPUS, target), ignore_errors=True)
        os.makedirs(os.path.join(CORPUS, target))
    tmp = tempfile.mkdtemp()
    try:
        pb2, tensor_pb2, json_format = load_protos(tmp)
        make_safetensors()
        make_specs(pb2, json_format)
        make_streams(pb2, tensor_pb2)
        make_predicates()
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
