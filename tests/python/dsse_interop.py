#!/usr/bin/python3
"""DSSE envelopes of base/dsse.h checked by an independent implementation.

Python's `cryptography` (Debian's python3-cryptography) verifies the Ed25519
signatures of envelopes dsse_tool signs, over the pre-authentication
encoding computed here from the DSSE spec's definition; dsse_tool verifies
envelopes signed here, and refuses altered ones.

Usage: dsse_interop.py DSSE_TOOL
"""
import base64
import json
import subprocess
import sys
import unittest

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

TOOL = None
RAW = serialization.Encoding.Raw


def pae(payload_type: bytes, body: bytes) -> bytes:
    # protocol.md: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body.
    return b" ".join([b"DSSEv1", str(len(payload_type)).encode(), payload_type,
                      str(len(body)).encode(), body])


def run(args, data: bytes):
    return subprocess.run([TOOL] + args, input=data, capture_output=True,
                          timeout=60)


def new_key():
    key = ed25519.Ed25519PrivateKey.generate()
    seed = key.private_bytes(RAW, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())
    public = key.public_key().public_bytes(RAW,
                                           serialization.PublicFormat.Raw)
    return key, seed, public


class DsseInteropTest(unittest.TestCase):

    def test_cryptography_verifies_what_cxx_signs(self):
        key, seed, public = new_key()
        for payload_type, body in [
                ("application/vnd.in-toto+json", b'{"_type": "x"}'),
                ("t\u00e9st", b""),
                ("http://example.com/HelloWorld", bytes(range(256)) * 40)]:
            done = run(["sign", seed.hex(), payload_type], body)
            self.assertEqual(done.returncode, 0, done.stderr)
            envelope = json.loads(done.stdout)
            self.assertEqual(envelope["payloadType"], payload_type)
            self.assertEqual(base64.b64decode(envelope["payload"]), body)
            self.assertEqual(len(envelope["signatures"]), 1)
            sig = base64.b64decode(envelope["signatures"][0]["sig"])
            # Raises InvalidSignature if it does not verify.
            key.public_key().verify(sig, pae(payload_type.encode(), body))
            with self.assertRaises(Exception):
                key.public_key().verify(sig, body)

    def test_cxx_verifies_what_cryptography_signs(self):
        key, _, public = new_key()
        body = b'{"subject": []}'
        payload_type = "application/vnd.in-toto+json"
        envelope = {
            "payload": base64.b64encode(body).decode(),
            "payloadType": payload_type,
            "signatures": [{
                "keyid": "",
                "sig": base64.b64encode(
                    key.sign(pae(payload_type.encode(), body))).decode(),
            }],
        }
        done = run(["verify", public.hex()], json.dumps(envelope).encode())
        self.assertEqual(done.returncode, 0, done.stderr)
        # Altered payload, altered type, another key: refused.
        for change in ("payload", "payloadType"):
            bad = dict(envelope)
            bad[change] = (base64.b64encode(b'{"subject": [1]}').decode()
                           if change == "payload" else "application/json")
            done = run(["verify", public.hex()], json.dumps(bad).encode())
            self.assertEqual(done.returncode, 1)
            self.assertIn(b"does not verify", done.stderr)
        _, _, other = new_key()
        done = run(["verify", other.hex()], json.dumps(envelope).encode())
        self.assertEqual(done.returncode, 1)


if __name__ == "__main__":
    TOOL = sys.argv.pop(1)
    unittest.main(verbosity=2)
