"""Forwarding in a modelstate cluster: GetStateDict and LoadStateDict of
one module through the replica that owns it (direct) and through another
replica that forwards the call (forwarded), in the same run. A real etcd
(Debian's etcd-server) and two modelstate-server processes on loopback;
the C++ client (modelstatectl get-state / load-state, into and from a file
on tmpfs where there is one) moves the bytes. Direct and forwarded
alternate, one of each per repetition; medians are reported.

Hooks across replicas: BuildModule of ResNet-50 (MLP with --smoke) with
one intercepting subscriber that approves everything (`modelstatectl
subscribe` with a rule-less policy), on a single server, and in the
cluster with the subscriber connected to the replica that does not own
the module, so every event and answer crosses replicas through the relay.
The two alternate, one build of each per repetition.

On one machine the forwarding replica shares the cores with the owner and
the client: these figures show what forwarding costs, not what a cluster
of machines can carry.

    cluster_bench.py --server BIN --cli BIN --out results.json
                     [--mib 256] [--reps 5] [--warmup 1] [--smoke]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from modelstate.v1 import model_state_service_pb2 as pb  # noqa: E402
from modelstate.v1 import model_state_service_pb2_grpc as pb_grpc  # noqa: E402,E501

from etcd_process import Etcd  # noqa: E402
from python_transfer_bench import cli_seconds  # noqa: E402
from server_process import Server  # noqa: E402

MIB = 1 << 20
MODELS = os.path.join(HERE, "models")


def cli(binary, server, *args):
    return subprocess.run([binary, "--server=" + server.address] +
                          list(args), check=True, capture_output=True,
                          text=True).stdout


def start_subscriber(binary, server, scratch):
    """An approve-everything interceptor on `server`, once it is listed."""
    policy = os.path.join(scratch, "approve.json")
    with open(policy, "w") as f:
        json.dump({"subscription": {"name": "bench-approve"}, "rules": []}, f)
    process = subprocess.Popen(
        [binary, "--server=" + server.address, "subscribe", "--policy",
         policy], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.ModelStateServiceStub(channel)
        deadline = time.time() + 30
        while "bench-approve" not in [
                s.subscription.name for s in stub.ListSubscribers(
                    pb.ListSubscribersRequest(), timeout=10).subscribers]:
            if time.time() > deadline or process.poll() is not None:
                raise RuntimeError("the subscriber did not attach")
            time.sleep(0.1)
    return process


def hooks_samples(args, owner, forwarder, scratch):
    """Build times with one interceptor: single server, and across replicas
    (the subscriber on the replica that does not own the module)."""
    model = "mlp" if args.smoke else "resnet50"
    spec = os.path.join(MODELS, model + ".json")
    request = pb.BuildModuleRequest(module="bench/hooked")
    with open(spec) as f:
        json_format.Parse(f.read(), request.spec)

    def build_seconds(server):
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.ModelStateServiceStub(channel)
            stub.ListModules(pb.ListModulesRequest(), timeout=30)  # connect
            start = time.perf_counter()
            stub.BuildModule(request, timeout=300)
            return time.perf_counter() - start
    single = Server(args.server)
    processes = []
    try:
        # Where "bench/hooked" lands (least loaded, ties by hash): the
        # same every time, since each build is deleted again.
        cli(args.cli, owner, "build", spec, "--name", "bench/hooked")
        status = json.loads(cli(args.cli, owner, "--json", "cluster",
                                "status"))
        placed = {p["module"]: p["owner"] for p in status["placements"]}
        cli(args.cli, owner, "rm", "bench/hooked")
        host, home = ((owner, forwarder)
                      if placed["bench/hooked"] == "owner"
                      else (forwarder, owner))
        processes.append(start_subscriber(args.cli, single, scratch))
        processes.append(start_subscriber(args.cli, home, scratch))
        samples = {"single_build_s": [], "cluster_build_s": []}
        for rep in range(args.warmup + args.reps):
            for key, server in (("single_build_s", single),
                                ("cluster_build_s", host)):
                seconds = build_seconds(server)
                cli(args.cli, server, "rm", "bench/hooked")
                if rep >= args.warmup:
                    samples[key].append(seconds)
        return model, samples
    finally:
        for process in processes:
            process.kill()
            process.wait()
        single.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.mib, args.reps, args.warmup = 8, 2, 0

    etcd = Etcd()
    scratch = tempfile.mkdtemp(
        dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    secret = os.path.join(scratch, "secret")
    with open(secret, "w") as f:
        f.write("a-cluster-secret-for-the-bench\n")
    servers = []
    try:
        for replica in ("owner", "forwarder"):
            servers.append(Server(
                args.server, "--etcd_endpoints=" + etcd.endpoint,
                "--replica_id=" + replica, "--cluster_secret_file=" + secret))
        owner, forwarder = servers
        # Placement picks one of the two (least loaded, ties by hash): the
        # status says which, and "direct" asks that one.
        side = 1024
        layers = max(1, args.mib * MIB // (side * side * 4))
        spec = json.dumps({"type": "Sequential", "children": [
            {"spec": {"type": "Linear", "args": [side, side],
                      "kwargs": {"bias": False}}} for _ in range(layers)]})
        spec_file = os.path.join(scratch, "spec.json")
        with open(spec_file, "w") as f:
            f.write(spec)
        subprocess.run([args.cli, "--server=" + owner.address, "build",
                        spec_file, "--name", "bench/stack"], check=True,
                       capture_output=True)
        status = subprocess.run(
            [args.cli, "--server=" + owner.address, "--json", "cluster",
             "status"], check=True, capture_output=True, text=True).stdout
        placed = {p["module"]: p["owner"]
                  for p in json.loads(status).get("placements", [])}
        via = {"direct": owner, "forwarded": forwarder}
        if placed["bench/stack"] != "owner":
            via = {"direct": forwarder, "forwarded": owner}
        state = os.path.join(scratch, "state.safetensors")
        samples = {f"{how}_{what}_s": [] for how in via
                   for what in ("get", "load")}
        for rep in range(args.warmup + args.reps):
            for how, server in via.items():
                get = cli_seconds(args.cli, server.address,
                                  ["get-state", "bench/stack", "-o", state])
                load = cli_seconds(args.cli, server.address,
                                   ["load-state", "bench/stack", state])
                if rep >= args.warmup:
                    samples[f"{how}_get_s"].append(get)
                    samples[f"{how}_load_s"].append(load)
        result = {"bytes": layers * side * side * 4, "reps": args.reps,
                  "warmup": args.warmup}
        result["hooks_model"], hooks = hooks_samples(args, owner, forwarder,
                                                     scratch)
        samples.update(hooks)
        for name, values in samples.items():
            result[name] = {"samples": values,
                            "median": statistics.median(values)}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    finally:
        for server in servers:
            server.stop()
        etcd.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
