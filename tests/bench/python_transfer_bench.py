"""The Python client's state_dict transfers against the C++ client's, in
the same run, on the same module and server: RemoteModule.state_dict() and
load_state_dict() against `modelstatectl get-state` / `load-state` (both
sides keep every byte: the Python client in tensors, the CLI in a
safetensors file on tmpfs where there is one). The two alternate, one of
each per repetition; medians are reported.

    python_transfer_bench.py --server BIN --cli BIN --out results.json
                             [--mib 600] [--reps 5] [--warmup 1] [--smoke]

Writes JSON: the bytes moved, and each figure's samples and median in
seconds (the CLI's own timing of its transfer, which leaves out its start).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import modelstate  # noqa: E402
from server_process import Server  # noqa: E402

MIB = 1 << 20
CHUNK = MIB  # the server's default; both clients use it


def linear_stack(layers):
    """Sequential of `layers` x Linear(1024, 1024, bias=False): 4 MiB each."""
    layer = {"type": "Linear", "args": [1024, 1024],
             "kwargs": {"bias": False}}
    return {"type": "Sequential",
            "children": [{"spec": layer} for _ in range(layers)]}


def cli_seconds(cli, address, args):
    """Runs modelstatectl; the seconds it reports for the transfer."""
    out = subprocess.run([cli, "--server=" + address] + args, check=True,
                         capture_output=True, text=True).stdout
    match = re.search(r" in ([0-9.]+) s \(", out)
    if not match:
        raise RuntimeError(f"modelstatectl printed no timing: {out!r}")
    return float(match.group(1))


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def summary(samples):
    return {"samples": samples, "median": statistics.median(samples)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mib", type=int, default=600)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="8 MiB (for the test suite)")
    args = parser.parse_args()
    mib = 8 if args.smoke else args.mib
    layers = max(1, mib // 4)

    server = Server(args.server)
    scratch = tempfile.mkdtemp(
        prefix="modelstate-bench-",
        dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    results = {"python_get_s": [], "cpp_get_s": [], "python_load_s": [],
               "cpp_load_s": []}
    try:
        ms = modelstate.connect(server.address, chunk_bytes=CHUNK,
                                progress=False)
        remote = ms.build(linear_stack(layers), "bench/stack", seed=0)
        nbytes = remote.info().total_bytes
        for rep in range(args.warmup + args.reps):
            keep = rep >= args.warmup
            # Symmetric: each side fills fresh memory right after the other
            # side freed its copy (tensors here, a new file for the CLI).
            py_get, state = timed(remote.state_dict)
            py_load, _ = timed(lambda: remote.load_state_dict(state))
            del state
            file = os.path.join(scratch, f"state{rep}.safetensors")
            cpp_get = cli_seconds(args.cli, server.address, [
                "get-state", "bench/stack", "-o", file,
                f"--chunk-kib={CHUNK >> 10}"])
            cpp_load = cli_seconds(args.cli, server.address, [
                "load-state", "bench/stack", file,
                f"--chunk-kib={CHUNK >> 10}"])
            os.remove(file)
            if keep:
                for key, value in (("python_get_s", py_get),
                                   ("cpp_get_s", cpp_get),
                                   ("python_load_s", py_load),
                                   ("cpp_load_s", cpp_load)):
                    results[key].append(value)
        ms.close()
    finally:
        server.stop()
        for name in os.listdir(scratch):
            os.remove(os.path.join(scratch, name))
        os.rmdir(scratch)
    out = {"bytes": nbytes, "chunk_bytes": CHUNK, "reps": args.reps,
           "warmup": args.warmup}
    out.update({key: summary(v) for key, v in results.items()})
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    for key in results:
        print(f"{key}: median {out[key]['median']:.3f} s "
              f"({nbytes / out[key]['median'] / 1e6:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
