"""How the cost of GetStateDict and LoadStateDict grows with the work:
time against state size (a stack of Linear(1024, 1024, bias=False), 4 MiB
each, from 64 MiB to 4 GiB) and against entry count (10 to 100,000
parameters sharing the same 64 MiB), through the C++ client
(modelstatectl get-state / load-state, into and from a file on tmpfs where
there is one) against one modelstate-server on loopback. A per-byte cost
shows as time growing with size at a steady rate; a per-entry cost as time
growing with the entry count at a fixed size. Medians of --reps after
--warmup.

    growth_bench.py --server BIN --cli BIN --out results.json
                    [--reps 3] [--warmup 1] [--smoke]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from python_transfer_bench import cli_seconds, linear_stack  # noqa: E402
from server_process import Server  # noqa: E402

MIB = 1 << 20



def transport():
    """How the clients moved the bytes: through the server's shared-memory
    ring (their default on its host) unless MODELSTATE_SHARED_MEMORY=0."""
    if os.environ.get("MODELSTATE_SHARED_MEMORY") == "0":
        return "gRPC messages"
    return "the shared-memory ring"

def flat_spec(entries, total_bytes):
    """A custom module of `entries` float32 parameters, `total_bytes` in
    all (uniform init: real bytes, not zero pages)."""
    numel = max(1, total_bytes // 4 // entries)
    return {"type": "Flat", "members": [
        {"parameter": {"name": "p%d" % i, "shape": [numel],
                       "init": {"kind": "uniform", "a": -1, "b": 1}}}
        for i in range(entries)]}


def measure(cli, server, module, spec, scratch, reps, warmup):
    """Builds `module` from `spec`, then times get-state and load-state."""
    spec_file = os.path.join(scratch, "spec.json")
    with open(spec_file, "w") as f:
        json.dump(spec, f)
    # A build of 100,000 tensors takes longer than the CLI's default 30 s
    # deadline on a busy 2-core machine.
    built = subprocess.run([cli, "--server=" + server.address, "--timeout",
                            "600", "build", spec_file, "--name", module],
                           capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError("build of %s failed: %s" % (module, built.stderr))
    state = os.path.join(scratch, "state.safetensors")
    gets, loads = [], []
    for rep in range(warmup + reps):
        get = cli_seconds(cli, server.address,
                          ["get-state", module, "-o", state])
        load = cli_seconds(cli, server.address, ["load-state", module, state])
        if rep >= warmup:
            gets.append(get)
            loads.append(load)
    subprocess.run([cli, "--server=" + server.address, "rm", module],
                   check=True, capture_output=True)
    os.remove(state)
    return {"get_s": statistics.median(gets), "load_s": statistics.median(loads),
            "get_samples": gets, "load_samples": loads}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    sizes_mib = [64, 256, 1024, 4096]
    entry_counts = [10, 100, 1000, 10000, 100000]
    entries_mib = 64
    if args.smoke:
        sizes_mib, entry_counts, entries_mib = [4, 8], [10, 100], 4
        args.reps, args.warmup = 1, 0

    scratch = tempfile.mkdtemp(
        dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    # A 100,000-member spec is a few MiB of request.
    server = Server(args.server, "--max_message_mib=64")
    result = {"reps": args.reps, "warmup": args.warmup, "size": [],
              "entries": []}
    try:
        for mib in sizes_mib:
            point = measure(args.cli, server, "growth/size",
                            linear_stack(mib // 4), scratch, args.reps,
                            args.warmup)
            point.update({"bytes": mib * MIB, "entries": mib // 4})
            result["size"].append(point)
        for entries in entry_counts:
            point = measure(args.cli, server, "growth/entries",
                            flat_spec(entries, entries_mib * MIB), scratch,
                            args.reps, args.warmup)
            point.update({"bytes": entries_mib * MIB, "entries": entries})
            result["entries"].append(point)
        result["transport"] = transport()
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
