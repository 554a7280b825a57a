"""The committed gRPC stubs of the Python client are what protoc and
grpc_python_plugin generate from proto/ today.

The stubs are committed (client/python/modelstate/v1) so that the package
installs with nothing but Python, grpcio and protobuf; this check keeps them
from drifting. It regenerates them into a temporary directory and compares
byte for byte; --write copies the fresh ones into place instead.

    stubs_current.py PROTOC GRPC_PYTHON_PLUGIN [--write]
"""

import difflib
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(
    os.path.abspath(__file__)), "..", ".."))
PROTO_DIR = os.path.join(ROOT, "proto")
COMMITTED = os.path.join(ROOT, "client", "python", "modelstate", "v1")


def generate(protoc, plugin, out):
    protos = sorted(glob.glob(os.path.join(PROTO_DIR, "modelstate", "v1",
                                           "*.proto")))
    subprocess.run([protoc, "-I", PROTO_DIR, "--python_out", out,
                    "--grpc_python_out", out,
                    "--plugin=protoc-gen-grpc_python=" + plugin] + protos,
                   check=True)
    return os.path.join(out, "modelstate", "v1")


def stub_names(directory):
    return sorted(os.path.basename(p) for p in
                  glob.glob(os.path.join(directory, "*_pb2*.py")))


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] != "--write"):
        print(__doc__, file=sys.stderr)
        return 2
    protoc, plugin = argv[1], argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(protoc, plugin, tmp)
        if len(argv) == 4:
            for name in stub_names(COMMITTED):
                os.remove(os.path.join(COMMITTED, name))
            for name in stub_names(fresh):
                shutil.copy(os.path.join(fresh, name), COMMITTED)
            print(f"wrote {len(stub_names(fresh))} stubs to {COMMITTED}")
            return 0
        problems = []
        want, have = stub_names(fresh), stub_names(COMMITTED)
        for name in sorted(set(want) | set(have)):
            if name not in have:
                problems.append(f"{name}: generated but not committed")
                continue
            if name not in want:
                problems.append(f"{name}: committed but no proto makes it")
                continue
            with open(os.path.join(fresh, name)) as f:
                new = f.readlines()
            with open(os.path.join(COMMITTED, name)) as f:
                old = f.readlines()
            if new != old:
                diff = "".join(list(difflib.unified_diff(
                    old, new, "committed/" + name, "generated/" + name))[:40])
                problems.append(f"{name} differs:\n{diff}")
        if problems:
            print("The committed stubs are out of date with proto/:\n\n" +
                  "\n".join(problems) + "\nRegenerate them with\n  " +
                  f"{argv[0]} {protoc} {plugin} --write", file=sys.stderr)
            return 1
        print(f"{len(want)} stubs match proto/")
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
