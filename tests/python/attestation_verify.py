"""Checks modelstate's attestations with reference implementations: a real
server builds a module, `modelstatectl attest` signs it and `get-state`
saves it; Python's `cryptography` verifies the DSSE signature (PAE as the
DSSE spec defines it) with the key the log's verifier key carries, and torch
recomputes every subject digest from the tensors of the safetensors file
(read here, independently of modelstate). A changed payload must not
verify. `get-state --sign`'s OpenSSF Model Signing bundle is checked the
same way: its DSSE signature, the file's SHA-256 (hashlib) as its one
resource, and the subject digest (SHA-256 over the resources' raw digests
in name order) as OMS defines it. A load's record holds the digest of the
bytes it brought in (SHA-256 over the entries' raw digests in key order).

Usage: attestation_verify.py MODELSTATE_SERVER MODELSTATECTL
"""

import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
import unittest

import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_process  # noqa: E402

SERVER, CLI = sys.argv[1], sys.argv[2]

TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16,
                "BF16": torch.bfloat16, "F64": torch.float64,
                "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
                "I8": torch.int8, "I16": torch.int16, "BOOL": torch.bool}


def pae(payload_type: bytes, body: bytes) -> bytes:
    return b"DSSEv1 %d %s %d %s" % (len(payload_type), payload_type,
                                    len(body), body)


def public_key(verifier_key: str) -> ed25519.Ed25519PublicKey:
    """<name>+<key ID>+<base64(0x01 || key)>: the base64 may hold '+'."""
    raw = base64.b64decode(verifier_key.split("+", 2)[2])
    assert raw[0] == 1, "not an Ed25519 verifier key"
    return ed25519.Ed25519PublicKey.from_public_bytes(raw[1:])


def read_safetensors(path):
    """name -> torch tensor, in file order."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        chunk = bytearray(body[begin:end])
        t = torch.frombuffer(chunk, dtype=TORCH_DTYPES[info["dtype"]]) \
            if chunk else torch.empty(0, dtype=TORCH_DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 of the tensor's raw little-endian bytes, row-major."""
    flat = t.contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


class AttestationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = server_process.Server(SERVER)
        cls.dir = cls.server.dir

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def cli(self, *args):
        r = subprocess.run([CLI, "--server", self.server.address, *args],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_reference_implementations_verify(self):
        spec = os.path.join(self.dir, "spec.json")
        with open(spec, "w") as f:
            json.dump({"type": "Sequential", "children": [
                {"spec": {"type": "Linear", "args": [8, 4]}},
                {"name": "norm_\u00e9", "spec": {"type": "BatchNorm1d",
                                                  "args": [4]}}]}, f)
        self.cli("build", spec, "--name", "py/mlp", "--seed", "3")
        self.cli("to", "py/mlp", "--dtype", "float16")
        envelope_path = os.path.join(self.dir, "mlp.dsse.json")
        st_path = os.path.join(self.dir, "mlp.safetensors")
        self.cli("attest", "py/mlp", "-o", envelope_path)
        self.cli("get-state", "py/mlp", "-o", st_path)
        key_line = json.loads(self.cli("--json", "audit", "key"))
        key = public_key(key_line["verifier_key"])

        with open(envelope_path) as f:
            envelope = json.load(f)
        payload = base64.b64decode(envelope["payload"])
        ptype = envelope["payloadType"].encode()
        self.assertEqual(ptype, b"application/vnd.in-toto+json")
        sig = base64.b64decode(envelope["signatures"][0]["sig"])
        key.verify(sig, pae(ptype, payload))  # raises if it does not verify
        with self.assertRaises(InvalidSignature):
            key.verify(sig, pae(ptype, payload.replace(b"float16",
                                                       b"float32")))

        statement = json.loads(payload)
        self.assertEqual(statement["_type"], "https://in-toto.io/Statement/v1")
        self.assertEqual(statement["predicateType"],
                         "https://slsa.dev/provenance/v1")
        tensors = read_safetensors(st_path)
        self.assertEqual([s["name"] for s in statement["subject"]],
                         ["0.weight", "0.bias"] +
                         ["norm_\u00e9." + n for n in
                          ["weight", "bias", "running_mean", "running_var",
                           "num_batches_tracked"]])
        for s in statement["subject"]:
            t = tensors[s["name"]]
            self.assertEqual(s["digest"]["sha256"], tensor_digest(t),
                             s["name"])
            # The digest covers the raw bytes alone: the dtype and shape
            # the signature binds are checked beside it.
            self.assertEqual(s["annotations"]["shape"], list(t.shape))
            self.assertEqual(s["annotations"]["dtype"],
                             str(t.dtype).replace("torch.", ""))
        self.assertEqual(statement["subject"][0]["annotations"]["dtype"],
                         "float16")
        build = statement["predicate"]["buildDefinition"][
            "externalParameters"]["build"]
        self.assertEqual(build["seed"], 3)
        # The spec as built, arguments included; its digest is the SHA-256
        # of its canonical text (compact, keys sorted, UTF-8 unescaped: the
        # child's name is not ASCII), recomputed here.
        self.assertEqual(build["spec"]["children"][0]["spec"],
                         {"type": "Linear", "args": [8, 4]})
        self.assertEqual(build["spec"]["children"][1]["spec"]["args"], [4])
        canonical = json.dumps(build["spec"], sort_keys=True,
                               separators=(",", ":"),
                               ensure_ascii=False).encode()
        self.assertEqual(build["spec_sha256"],
                         hashlib.sha256(canonical).hexdigest())
        changes = statement["predicate"]["buildDefinition"][
            "externalParameters"]["changes"]
        self.assertEqual([c["type"] for c in changes], ["move"])

    def test_signed_state_file_and_load_digest(self):
        spec = os.path.join(self.dir, "lin.json")
        with open(spec, "w") as f:
            json.dump({"type": "Linear", "args": [5, 3]}, f)
        self.cli("build", spec, "--name", "py/lin", "--seed", "4")
        st_path = os.path.join(self.dir, "lin.safetensors")
        out = self.cli("get-state", "py/lin", "-o", st_path, "--sign")
        with open(st_path, "rb") as f:
            file_sha = hashlib.sha256(f.read()).hexdigest()
        self.assertIn(file_sha, out)
        with open(st_path + ".sig") as f:
            bundle = json.load(f)
        self.assertEqual(bundle["mediaType"],
                         "application/vnd.dev.sigstore.bundle.v0.3+json")
        envelope = bundle["dsseEnvelope"]
        payload = base64.b64decode(envelope["payload"])
        ptype = envelope["payloadType"].encode()
        sig = base64.b64decode(envelope["signatures"][0]["sig"])
        key_line = json.loads(self.cli("--json", "audit", "key"))
        public_key(key_line["verifier_key"]).verify(sig, pae(ptype, payload))
        statement = json.loads(payload)
        self.assertEqual(statement["predicateType"],
                         "https://model_signing/signature/v1.0")
        predicate = statement["predicate"]
        self.assertEqual(predicate["serialization"]["method"], "files")
        self.assertEqual(predicate["resources"],
                         [{"name": "lin.safetensors", "algorithm": "sha256",
                           "digest": file_sha}])
        self.assertEqual(statement["subject"][0]["digest"]["sha256"],
                         hashlib.sha256(bytes.fromhex(file_sha)).hexdigest())
        self.cli("verify-bundle", st_path + ".sig", "--key",
                 key_line["verifier_key"], "--file", st_path)

        # A load's record: SHA-256 over each entry's digest, in key order.
        self.cli("load-state", "py/lin", st_path)
        tensors = read_safetensors(st_path)
        expected = hashlib.sha256(b"".join(
            bytes.fromhex(tensor_digest(tensors[k]))
            for k in sorted(tensors))).hexdigest()
        lines = self.cli("--json", "audit", "query", "--module", "lin",
                         "--type", "load_state_dict").splitlines()
        details = json.loads(json.loads(lines[-1])["details_json"])
        self.assertEqual(details["sha256"], expected)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
