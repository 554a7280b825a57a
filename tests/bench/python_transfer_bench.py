"""The Python client's state_dict transfers against the C++ client's, in
the same run, on the same module and server: RemoteModule.state_dict() and
load_state_dict() against `modelstatectl get-state` / `load-state` (both
sides keep every byte: the Python client in tensors, the CLI in a
safetensors file on tmpfs where there is one; the server's data directory
is there too). The two alternate, one of each per repetition; medians are
reported. Three models, as their state differs in shape: a stack of 4 MiB
Linear weights, ResNet-50 (320 entries, most of them small) and GPT-2 small
(one 147 MiB embedding among 148 entries), from tests/bench/models.
Then a module refreshed in place: pull(into=) of the pulled module against
PyTorch's own load_state_dict() into it from a state_dict in memory (both
copy every byte into the module's tensors, already faulted in).

    python_transfer_bench.py --server BIN --cli BIN --out results.json
                             [--mib 600] [--models stack,resnet50,gpt2]
                             [--reps 5] [--warmup 1] [--smoke]

Writes JSON: for each model, the bytes moved and each figure's samples and
median in seconds (the CLI's own timing of its transfer, which leaves out
its start).
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



def transport():
    """How the clients moved the bytes: through the server's shared-memory
    ring (their default on its host) unless MODELSTATE_SHARED_MEMORY=0."""
    if os.environ.get("MODELSTATE_SHARED_MEMORY") == "0":
        return "gRPC messages"
    return "the shared-memory ring"

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


def spec_of(model, mib):
    if model == "stack":
        return linear_stack(max(1, mib // 4))
    with open(os.path.join(HERE, "models", model + ".json")) as f:
        return json.load(f)


def measure(ms, cli, address, scratch, model, spec, reps, warmup):
    """Times both clients on `spec`, built as bench/<model>."""
    name = "bench/" + model
    remote = ms.build(spec, name, seed=0)
    results = {"python_get_s": [], "cpp_get_s": [], "python_load_s": [],
               "cpp_load_s": []}
    for rep in range(warmup + reps):
        # Symmetric: each side fills fresh memory right after the other
        # side freed its copy (tensors here, a new file for the CLI).
        py_get, state = timed(remote.state_dict)
        py_load, _ = timed(lambda: remote.load_state_dict(state))
        entries = len(state)
        del state
        file = os.path.join(scratch, f"state{rep}.safetensors")
        cpp_get = cli_seconds(cli, address, [
            "get-state", name, "-o", file, f"--chunk-kib={CHUNK >> 10}"])
        cpp_load = cli_seconds(cli, address, [
            "load-state", name, file, f"--chunk-kib={CHUNK >> 10}"])
        os.remove(file)
        if rep >= warmup:
            for key, value in (("python_get_s", py_get),
                               ("cpp_get_s", cpp_get),
                               ("python_load_s", py_load),
                               ("cpp_load_s", cpp_load)):
                results[key].append(value)
    local = remote.pull()
    in_memory = {k: v.clone() for k, v in local.state_dict().items()}
    for rep in range(warmup + reps):
        into, _ = timed(lambda: remote.pull(into=local))
        copy, _ = timed(lambda: local.load_state_dict(in_memory))
        if rep >= warmup:
            results.setdefault("python_pull_into_s", []).append(into)
            results.setdefault("torch_load_state_dict_s", []).append(copy)
    del local, in_memory
    out = {"bytes": remote.info().total_bytes, "entries": entries}
    remote.delete()
    out.update({key: summary(v) for key, v in results.items()})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mib", type=int, default=600,
                        help="size of the Linear stack")
    parser.add_argument("--models", default="stack,resnet50,gpt2")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="an 8 MiB stack and the small MLP (for the "
                             "test suite)")
    args = parser.parse_args()
    mib = 8 if args.smoke else args.mib
    models = ["stack", "mlp"] if args.smoke else args.models.split(",")

    # The server's data directory and the CLI's files on tmpfs where there
    # is one: the figures compare the two clients, and a disk's swings
    # (this machine's durable write of 622 MiB takes 0.3 s or 1.7 s, as
    # ext4 reuses blocks or takes new ones) would only add noise to both.
    tmpfs = "/dev/shm" if os.path.isdir("/dev/shm") else None
    server = Server(args.server, root=tmpfs)
    scratch = tempfile.mkdtemp(prefix="modelstate-bench-", dir=tmpfs)
    out = {"chunk_bytes": CHUNK, "reps": args.reps, "warmup": args.warmup,
           "models": {}}
    try:
        ms = modelstate.connect(server.address, chunk_bytes=CHUNK,
                                progress=False)
        for model in models:
            out["models"][model] = measure(
                ms, args.cli, server.address, scratch, model,
                spec_of(model, mib), args.reps, args.warmup)
        ms.close()
    finally:
        server.stop()
        for name in os.listdir(scratch):
            os.remove(os.path.join(scratch, name))
        os.rmdir(scratch)
    out["transport"] = transport()
    out["server_data_dir"] = "tmpfs" if tmpfs else "disk"
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    for model, m in out["models"].items():
        for key in ("python_get_s", "cpp_get_s", "python_load_s",
                    "cpp_load_s", "python_pull_into_s",
                    "torch_load_state_dict_s"):
            median = m[key]["median"]
            print(f"{model} {key}: median {median:.3f} s "
                  f"({m['bytes'] / median / 1e6:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
