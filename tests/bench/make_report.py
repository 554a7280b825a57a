"""Writes BENCHMARKS.md from one run's results.

Every figure is a ratio against a baseline measured in the same run on the
same machine, from medians (the machines are noisy). Inputs:
  --core       core_bench's Google Benchmark JSON (--benchmark_out), run
               with --benchmark_repetitions and aggregates (medians used)
  --torch      torch_bench.py's JSON (PyTorch 1.13, same thread count)
  --transfer   transfer_bench's JSON (modelstate-server vs raw gRPC)
  --forward    optional: forward_bench's Google Benchmark JSON
  --torch-forward  optional: torch_forward_bench.py's JSON
  --python-transfer  optional: python_transfer_bench.py's JSON (the Python
               client against modelstatectl)
  --checks     optional: a text file with extra lines for the notes

Usage (any python3; no third-party modules):
    make_report.py --core core.json --torch torch.json
        --transfer transfer.json --out BENCHMARKS.md
"""
import argparse
import datetime
import json
import os
import platform
import sys

MIB = 1 << 20


def load(path):
    with open(path) as f:
        return json.load(f)


def bench_medians(results):
    """Google Benchmark JSON -> {name: run} using the median aggregate.

    Without repetitions there are no aggregates: the single run is used.
    """
    medians, singles = {}, {}
    for run in results.get("benchmarks", []):
        # "BM_X/1024/1024/real_time": the name without "/real_time".
        name = run.get("run_name", run["name"])
        if name.endswith("/real_time"):
            name = name[:-len("/real_time")]
        if run.get("run_type") == "aggregate":
            if run.get("aggregate_name") == "median":
                medians[name] = run
        else:
            singles.setdefault(name, run)
    singles.update(medians)
    return singles


def seconds(run):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[run["time_unit"]]
    return run["real_time"] * scale


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
            memory = f", {kib / (1 << 20):.0f} GiB memory"
    except (OSError, ValueError, IndexError):
        pass
    return (f"{model}, {os.cpu_count()} cores{memory}, "
            f"{platform.system()} {platform.release()}")


class Table:
    """Rows of (figure, measured, baseline, ratio, target, met)."""

    def __init__(self):
        self.rows = []

    def add(self, figure, measured, baseline, ratio, target, met):
        # met=None: a breakdown row, not a target of its own.
        mark = "-" if met is None else "yes" if met else "**no**"
        self.rows.append((figure, measured, baseline, ratio, target, mark))

    def markdown(self):
        head = ("| figure | measured | baseline (same run) | ratio | target"
                " | met |\n|---|---|---|---|---|---|\n")
        return head + "".join("| " + " | ".join(r) + " |\n"
                              for r in self.rows)


def fmt_s(value):
    if abs(value) < 1e-3:
        return f"{value * 1e6:.0f} us"
    return f"{value * 1e3:.1f} ms" if abs(value) < 10 else f"{value:.2f} s"


def signed_s(value):
    return ("+" if value >= 0 else "-") + fmt_s(abs(value))


def rate(num_bytes, secs):
    return f"{num_bytes / secs / 1e9:.2f} GB/s"


def transfer_rows(table, t):
    x = t["transfer"]
    n = x["bytes"]
    down, get = x["raw_download_s"]["median"], x["get_state_dict_s"]["median"]
    up, load_s = x["raw_upload_s"]["median"], x["load_state_dict_s"]["median"]
    chunk = x["chunk_bytes"] // 1024
    table.add(f"GetStateDict, {x['model']} ({n / MIB:.0f} MiB, {chunk} KiB "
              "chunks)", f"{fmt_s(get)} ({rate(n, get)})",
              f"raw gRPC download {fmt_s(down)} ({rate(n, down)})",
              f"{down / get:.2f}x", ">= 0.9x", down / get >= 0.9)
    table.add(f"LoadStateDict, {x['model']}, same chunks (durable: "
              "answered once on disk)",
              f"{fmt_s(load_s)} ({rate(n, load_s)})",
              f"raw gRPC upload {fmt_s(up)} ({rate(n, up)})",
              f"{up / load_s:.2f}x", "(breakdown)", None)
    # A durable load can go no faster than the slower of its two halves:
    # the bytes' journey, and their write and sync on the same disk.
    if "raw_durable_write_s" in x:
        disk = x["raw_durable_write_s"]["median"]
        bound = max(up, disk)
        which = "upload" if up >= disk else "durable write"
        samples = x["raw_durable_write_s"]["samples"]
        table.add(f"LoadStateDict, {x['model']}, against the slower of "
                  "upload and disk",
                  f"{fmt_s(load_s)} ({rate(n, load_s)})",
                  f"raw durable write (write, early writeback, fdatasync) {fmt_s(disk)} "
                  f"({rate(n, disk)}; from {fmt_s(min(samples))} to "
                  f"{fmt_s(max(samples))}); the bound: {which}",
                  f"{bound / load_s:.2f}x", ">= 0.9x", bound / load_s >= 0.9)
    # The CPU a load takes (server and client together) spread over the
    # machine's cores: a third bound, the one a machine of few cores meets
    # before its disk or its loopback.
    if "load_server_cpu_s" in x:
        server = x["load_server_cpu_s"]["median"]
        client = x["load_client_cpu_s"]["median"]
        cores = x["cores"]
        floor = (server + client) / cores
        table.add(f"LoadStateDict, {x['model']}, against the CPU it takes "
                  "on this machine's cores",
                  fmt_s(load_s),
                  f"server {fmt_s(server)} + client {fmt_s(client)} of CPU "
                  f"over {cores} cores = {fmt_s(floor)}",
                  f"{floor / load_s:.2f}x", "(breakdown)", None)
    hosted = x["hosted_bytes"]
    limit = 1.1 * hosted + 64 * MIB
    for what in ("get", "load"):
        peak = x[f"server_peak_rss_{what}_bytes"]
        table.add(f"server peak RSS during {'GetStateDict' if what == 'get' else 'LoadStateDict'}",
                  f"{peak / MIB:.0f} MiB",
                  f"1.1 x hosted {hosted / MIB:.0f} MiB + 64 MiB = "
                  f"{limit / MIB:.0f} MiB", f"{peak / limit:.2f}x",
                  "<= 1.0x", peak <= limit)


def shared_memory_rows(table, t):
    m = t.get("shared_memory")
    if m is None:
        return
    n = m["bytes"]
    get = m["get_shared_s"]["median"]
    fresh = m["memcpy_fresh_s"]["median"]
    warm = m["memcpy_warm_s"]["median"]
    grpc_get = m["get_grpc_s"]["median"]
    def how_placed(placed):
        return ("the server writes them where the kernel lets it: one copy"
                if placed is None else "the server writes them: one copy"
                if placed == n else
                "through the ring's slots: the kernel refused direct writes")

    how = how_placed(m.get("direct_placed_bytes"))
    table.add(f"GetStateDict through shared memory, {m['model']} "
              f"({n / MIB:.0f} MiB) into new tensors ({how})",
              f"{fmt_s(get)} ({rate(n, get)})",
              f"memcpy into fresh memory {fmt_s(fresh)} ({rate(n, fresh)})",
              f"{fresh / get:.2f}x", ">= 0.8x", fresh / get >= 0.8)
    table.add("GetStateDict through shared memory, against memcpy into "
              "memory already faulted in", f"{fmt_s(get)}",
              f"memcpy {fmt_s(warm)} ({rate(n, warm)})",
              f"{warm / get:.2f}x", "(breakdown)", None)
    if "get_into_s" in m:
        into = m["get_into_s"]["median"]
        warm_beside = m["memcpy_warm_beside_into_s"]["median"]
        table.add(f"GetStateDict through shared memory, {m['model']}, into "
                  f"tensors the client already has (a replica refreshed in "
                  f"place; {how_placed(m.get('into_placed_bytes'))})",
                  f"{fmt_s(into)} ({rate(n, into)})",
                  f"memcpy into memory already faulted in "
                  f"{fmt_s(warm_beside)} ({rate(n, warm_beside)})",
                  f"{warm_beside / into:.2f}x", ">= 0.8x",
                  warm_beside / into >= 0.8)
    if "get_slots_s" in m:
        slots = m["get_slots_s"]["median"]
        table.add("GetStateDict through the ring's slots only (two copies), "
                  "against memcpy into fresh memory",
                  f"{fmt_s(slots)} ({rate(n, slots)})",
                  f"memcpy {fmt_s(fresh)}", f"{fresh / slots:.2f}x",
                  "(breakdown)", None)
    table.add("GetStateDict through shared memory, against the same call as "
              "gRPC messages", f"{fmt_s(get)}",
              f"gRPC {fmt_s(grpc_get)} ({rate(n, grpc_get)})",
              f"{grpc_get / get:.2f}x", "(breakdown)", None)
    load_s = m["load_shared_s"]["median"]
    grpc_load = m["load_grpc_s"]["median"]
    table.add("LoadStateDict (durable) through the ring, against the same "
              "call as gRPC messages", f"{fmt_s(load_s)} ({rate(n, load_s)})",
              f"gRPC {fmt_s(grpc_load)} ({rate(n, grpc_load)})",
              f"{grpc_load / load_s:.2f}x", "(breakdown)", None)


def mapped_rows(table, t):
    """--map_saved_bytes against hosting in memory: informational rows
    that say whether it could be the default."""
    m = t.get("mapped")
    if m is None:
        return
    n = m["bytes"]
    for label, key in (("durable LoadStateDict", "load"),
                       ("to(float16) and back to float32", "half_and_back"),
                       ("GetStateDict", "get")):
        mapped = m[f"{key}_mapped_s"]["median"]
        memory = m[f"{key}_memory_s"]["median"]
        table.add(f"--map_saved_bytes: {label}, {m['model']} "
                  f"({n / MIB:.0f} MiB), hosted from the data files",
                  fmt_s(mapped), f"hosted in memory {fmt_s(memory)}",
                  f"{memory / mapped:.2f}x", "(decides the default)", None)


def restore_rows(table, t):
    r = t.get("restore")
    if r is None:
        return
    n = r["hosted_bytes"]
    restart = r["restart_s"]["median"]
    read = r["read_files_s"]["median"]
    table.add(f"restart with {n / MIB:.0f} MiB hosted (start to serving; "
              "data files mapped, bytes checked when first read)",
              fmt_s(restart),
              f"reading the {r['file_bytes'] / MIB:.0f} MiB of data files "
              f"{fmt_s(read)} ({rate(r['file_bytes'], read)})",
              f"{read / restart:.2f}x", "reported", None)
    empty = r.get("empty")
    big = r.get("eight_times")
    if empty is None or big is None:
        return
    base = empty["restart_s"]["median"]
    table.add(f"restart with {n / MIB:.0f} MiB hosted, against nothing "
              f"hosted ({r['layers'] * 2} tensors: manifest parsing and "
              "mapping)", fmt_s(restart), f"nothing hosted {fmt_s(base)}",
              signed_s(restart - base), "(breakdown)", None)
    m = big["hosted_bytes"]
    grown = big["restart_s"]["median"]
    table.add(f"restart with {m / MIB:.0f} MiB hosted, against "
              f"{n / MIB:.0f} MiB in as many tensors",
              fmt_s(grown), f"{n / MIB:.0f} MiB {fmt_s(restart)}",
              signed_s(grown - restart),
              "<= +100 ms (restart time independent of bytes hosted)",
              grown - restart <= 0.1)


def attest_rows(table, t):
    a = t.get("attest")
    if a is None:
        return
    n = a["bytes"]
    sha = a["sha256_1thread_s"]["median"]
    attest = a["attest_s"]["median"]
    sign = a["sign_state_file_s"]["median"]
    table.add(f"AttestModule, {a['model']} ({n / MIB:.0f} MiB; every tensor "
              "hashed on 2 threads, records read, signed)",
              f"{fmt_s(attest)} ({rate(n, attest)})",
              f"OpenSSL SHA-256, 1 thread {fmt_s(sha)} ({rate(n, sha)})",
              f"{sha / attest:.2f}x", "<= 0.5 s",
              attest <= 0.5 if a["model"] == "gpt2" else None)
    table.add(f"SignStateFile, {a['model']} (the state as one safetensors "
              "file, hashed on 1 thread, signed)",
              f"{fmt_s(sign)} ({rate(n, sign)})",
              f"OpenSSL SHA-256, 1 thread {fmt_s(sha)}",
              f"{sha / sign:.2f}x", "reported", None)


def hook_rows(table, t, torch_results):
    h = t["hooks"]
    p50 = t["ping_pong"]["p50_us"]
    regs = h["registrations"]
    sequential = regs * p50 * 1e-6
    b0 = h["build_0_interceptors_s"]["median"]
    b1 = h["build_1_interceptors_s"]["median"]
    b4 = h["build_4_interceptors_s"]["median"]
    baseline = (f"{regs} registrations x ping-pong p50 {p50:.0f} us = "
                f"{fmt_s(sequential)}")
    table.add(f"BuildModule {h['model']}, 1 remote interceptor approving",
              fmt_s(b1), baseline, f"{b1 / sequential:.2f}x", "<= 0.5x",
              b1 / sequential <= 0.5)
    table.add(f"  of which the hooks: 1 interceptor minus none ({fmt_s(b0)})",
              fmt_s(b1 - b0), baseline, f"{(b1 - b0) / sequential:.2f}x",
              "(breakdown)", None)
    table.add(f"BuildModule {h['model']}, 4 interceptors", fmt_s(b4),
              f"1 interceptor {fmt_s(b1)}", f"{b4 / b1:.2f}x", "<= 1.5x",
              b4 / b1 <= 1.5)
    # A durable build: PyTorch's construction of the same model plus the
    # least its bytes' write and sync cost on this disk.
    theirs = torch_results["models"].get(h["model"])
    if theirs and "raw_durable_write_s" in h:
        construct = theirs["construct"]["median_s"]
        disk = h["raw_durable_write_s"]["median"]
        bound = construct + disk
        samples = h["raw_durable_write_s"]["samples"]
        table.add(f"BuildModule {h['model']}, no hooks (durable: answered "
                  f"once on disk, {h['bytes'] / MIB:.0f} MiB)", fmt_s(b0),
                  f"PyTorch construction {fmt_s(construct)} + raw durable "
                  f"write {fmt_s(disk)} (from {fmt_s(min(samples))} to "
                  f"{fmt_s(max(samples))}) = {fmt_s(bound)}",
                  f"{b0 / bound:.2f}x", "<= 1.2x", b0 / bound <= 1.2)
    # The CPU the build takes in the server, spread over the machine's
    # cores: initialisation, page zeroing, the audit's SHA-256 of every
    # tensor and the write share them.
    if "build_0_server_cpu_s" in h:
        cpu = h["build_0_server_cpu_s"]["median"]
        cores = h["cores"]
        table.add(f"BuildModule {h['model']}, no hooks, against the CPU it "
                  "takes on this machine's cores", fmt_s(b0),
                  f"server {fmt_s(cpu)} of CPU over {cores} cores = "
                  f"{fmt_s(cpu / cores)}", f"{cpu / cores / b0:.2f}x",
                  "(breakdown)", None)


def core_rows(table, core, torch_results, model):
    gpt2 = torch_results["models"].get(model)
    label = "GPT-2 shape" if model == "gpt2" else model
    construct = core.get("BM_ConstructDefaultInit")
    if construct and gpt2:
        ours, theirs = seconds(construct), gpt2["construct"]["median_s"]
        table.add(f"core: construct {label}, default init",
                  fmt_s(ours),
                  f"PyTorch {torch_results['torch_version']}, "
                  f"{torch_results['threads']} thread(s): {fmt_s(theirs)}",
                  f"{ours / theirs:.2f}x", "<= 0.2x (issue 20)",
                  ours / theirs <= 0.2)
    load_run, memcpy_run = (core.get("BM_LoadStateDictCopy"),
                            core.get("BM_MemcpyBaseline"))
    if load_run and memcpy_run:
        ours, base = seconds(load_run), seconds(memcpy_run)
        table.add(f"core: load_state_dict (copy), {label}",
                  f"{fmt_s(ours)} ({load_run['bytes_per_second'] / 1e9:.1f}"
                  " GB/s)",
                  f"memcpy {fmt_s(base)} "
                  f"({memcpy_run['bytes_per_second'] / 1e9:.1f} GB/s)",
                  f"{base / ours:.2f}x", ">= 0.8x", base / ours >= 0.8)
    to_run, f16c = core.get("BM_ToFloat16"), core.get("BM_F16cLoopBaseline")
    if to_run and f16c:
        ours, base = seconds(to_run), seconds(f16c)
        table.add(f"core: to(float16), {label}",
                  f"{fmt_s(ours)} ({to_run['items_per_second'] / 1e9:.2f}"
                  " Gelem/s)",
                  f"F16C loop {fmt_s(base)} "
                  f"({f16c['items_per_second'] / 1e9:.2f} Gelem/s)",
                  f"{base / ours:.2f}x", ">= 0.9x (issue 20)",
                  base / ours >= 0.9)
    for arg, where in (("0", "1 MiB in cache"), ("1", "a large buffer")):
        crc = core.get(f"BM_Crc32c/{arg}")
        one = core.get(f"BM_Crc32cOneChainBaseline/{arg}")
        if crc and one:
            ours, base = crc["bytes_per_second"], one["bytes_per_second"]
            table.add(f"core: CRC-32C of {where} (three crc32 chains)",
                      f"{ours / 1e9:.1f} GB/s",
                      f"one crc32 chain {base / 1e9:.1f} GB/s",
                      f"{ours / base:.2f}x", "(breakdown)", None)
    meta = core.get("BM_MetaTrillion")
    if meta:
        secs, rss = seconds(meta), meta["peak_rss_mib"]
        table.add(f"meta device: build {meta['params']:.3g} parameters",
                  f"{fmt_s(secs)}, peak RSS {rss:.0f} MiB",
                  "absolute: 1 s, 100 MiB",
                  f"{secs:.3f}x, {rss / 100:.2f}x", "< 1 s, < 100 MiB",
                  secs < 1 and rss < 100)
    if gpt2:
        for what, name in (("load_state_dict", "BM_LoadStateDictCopy"),
                           ("to_float16", "BM_ToFloat16")):
            if core.get(name):
                ours, theirs = seconds(core[name]), gpt2[what]["median_s"]
                table.add(f"  for reference: {what}, {label}, vs PyTorch",
                          fmt_s(ours), f"PyTorch {fmt_s(theirs)}",
                          f"{ours / theirs:.2f}x", "(none)", None)


def concurrency_rows(table, t):
    c = t["concurrency"]
    single = c["single_client_s"]["median"]
    together = c["all_clients_s"]["median"]
    n, size = c["clients"], c["bytes_per_client"]
    # Aggregate throughput over one client's is the time ratio times n.
    ratio = n * single / together if together > 0 else 0.0
    errors = c["errors"]
    first = c.get("first_error", "")
    table.add(f"{n} concurrent clients, each GetStateDict {size / MIB:.0f} "
              f"MiB ({errors} errors{': ' + first if first else ''})",
              f"aggregate {rate(n * size, together)}",
              f"one client, {n} fetches in a row {rate(size, single)}",
              f"{ratio:.2f}x",
              ">= 0.9x (issue 20), no errors", ratio >= 0.9 and errors == 0)
    if "all_server_cpu_per_fetch_s" not in c:
        return
    # CPU is counted in 10 ms ticks, so a fetch's CPU is the mean over the
    # repetitions, not their median. The clients run in this benchmark's
    # process, on the same cores as the server: when they all fetch at
    # once, the machine's CPU, not the server's efficiency, sets the pace.
    def mean(key):
        samples = c[key]["samples"]
        return sum(samples) / len(samples)
    server_one, server_all = (mean("single_server_cpu_s"),
                              mean("all_server_cpu_per_fetch_s"))
    client_one, client_all = (mean("single_client_cpu_s"),
                              mean("all_client_cpu_per_fetch_s"))
    table.add(f"  the server's CPU per fetch, {n} clients at once",
              fmt_s(server_all), f"one client in a row {fmt_s(server_one)}",
              f"{server_all / server_one:.2f}x" if server_one > 0 else "-",
              "(breakdown)", None)
    table.add(f"  the clients' CPU per fetch (this process), {n} at once",
              fmt_s(client_all), f"one client in a row {fmt_s(client_one)}",
              f"{client_all / client_one:.2f}x" if client_one > 0 else "-",
              "(breakdown)", None)
    cores = c["cores"]
    floor = n * (server_all + client_all) / cores
    table.add(f"  {n} clients against the CPU they take on this machine's "
              "cores", fmt_s(together),
              f"{n} x (server {fmt_s(server_all)} + client "
              f"{fmt_s(client_all)}) over {cores} cores = {fmt_s(floor)}",
              f"{floor / together:.2f}x", "(breakdown)", None)


def idle_latency_rows(table, t):
    i = t.get("idle_latency")
    if not i:
        return
    idle, busy = i["idle"], i["back_to_back"]
    table.add(f"p99 of {i['calls']} small GetStateDicts, each after an idle "
              f"gap of 0 to 300 ms (max {fmt_s(idle['max_s'])})",
              fmt_s(idle["p99_s"]),
              f"the same back to back: p99 {fmt_s(busy['p99_s'])}",
              f"{idle['p99_s'] / busy['p99_s']:.2f}x", "(breakdown)", None)


def forward_rows(table, forward, torch_forward):
    for name, run in sorted(forward.items()):
        if not name.startswith("BM_LinearForward/"):
            continue
        shape = name[len("BM_LinearForward/"):]
        base = forward.get("BM_RawSgemm/" + shape)
        if not base:
            continue
        ours, theirs = run["GFLOP/s"], base["GFLOP/s"]
        table.add(f"Linear forward, batch 256, {shape.replace('/', ' -> ')}",
                  f"{ours:.1f} GFLOP/s ({fmt_s(seconds(run))})",
                  f"raw cblas_sgemm {theirs:.1f} GFLOP/s",
                  f"{ours / theirs:.2f}x", ">= 0.9x", ours / theirs >= 0.9)
    block = forward.get("BM_Gpt2Block")
    if block and torch_forward:
        ours = seconds(block)
        theirs = torch_forward["causal_mask"]["median_s"]
        table.add("GPT-2-small block forward (1 x 1024 tokens, causal mask)",
                  fmt_s(ours),
                  f"PyTorch {torch_forward['torch_version']}, "
                  f"{torch_forward['threads']} thread(s): {fmt_s(theirs)}",
                  f"{ours / theirs:.2f}x", "<= 1.0x", ours <= theirs)
    mapped = forward.get("BM_Gpt2BlockMappedWeights")
    if block and mapped:
        ours, theirs = seconds(mapped), seconds(block)
        table.add("  the same block, its weights mapped from a data file (as "
                  "after a restart, or with --map_saved_bytes)", fmt_s(ours),
                  f"weights in the process's own memory {fmt_s(theirs)}",
                  f"{ours / theirs:.2f}x", "(breakdown)", None)


def python_rows(table, p):
    """The Python client's transfers against the C++ client's (ratio of
    throughputs, Python / C++), one pair of rows per model."""
    for model, m in p["models"].items():
        n = m["bytes"]
        for what, py, cpp, cli in (
                ("state_dict()", "python_get_s", "cpp_get_s", "get-state"),
                ("load_state_dict()", "python_load_s", "cpp_load_s",
                 "load-state")):
            ours, base = m[py]["median"], m[cpp]["median"]
            where = p.get("server_data_dir")
            table.add(f"Python client {what}, {model} ({n / MIB:.0f} MiB, "
                      f"{m['entries']} entries, both clients through "
                      f"{p.get('transport', 'gRPC messages')}"
                      f"{'; server data on ' + where if where else ''})",
                      f"{fmt_s(ours)} ({rate(n, ours)})",
                      f"C++ client (modelstatectl {cli}) {fmt_s(base)} "
                      f"({rate(n, base)})", f"{base / ours:.2f}x", ">= 0.8x",
                      base / ours >= 0.8)
        if "python_pull_into_s" in m:
            ours = m["python_pull_into_s"]["median"]
            base = m["torch_load_state_dict_s"]["median"]
            table.add(f"Python client pull(into=module), {model} "
                      f"({n / MIB:.0f} MiB): the pulled module refreshed "
                      f"in place", f"{fmt_s(ours)} ({rate(n, ours)})",
                      f"PyTorch load_state_dict() into it from memory "
                      f"{fmt_s(base)} ({rate(n, base)})",
                      f"{base / ours:.2f}x", ">= 0.8x", base / ours >= 0.8)


def cluster_rows(table, c):
    """Calls forwarded by a replica that does not own the module against
    the same calls to the owner (ratio of throughputs, forwarded / direct).
    """
    n = c["bytes"]
    for what, key, cli in (("GetStateDict", "get", "get-state"),
                           ("LoadStateDict", "load", "load-state")):
        ours = c[f"forwarded_{key}_s"]["median"]
        base = c[f"direct_{key}_s"]["median"]
        table.add(f"Cluster: {what} forwarded by another replica "
                  f"({n / MIB:.0f} MiB, modelstatectl {cli}; two servers, the "
                  f"client and etcd on one machine)",
                  f"{fmt_s(ours)} ({rate(n, ours)})",
                  f"the owner, directly: {fmt_s(base)} ({rate(n, base)})",
                  f"{base / ours:.2f}x", ">= 0.8x", base / ours >= 0.8)
    if "cluster_build_s" in c:
        ours = c["cluster_build_s"]["median"]
        base = c["single_build_s"]["median"]
        table.add(f"Cluster: BuildModule {c['hooks_model']} with 1 interceptor "
                  f"connected to another replica (every event and answer "
                  f"relayed)", fmt_s(ours),
                  f"a single server, its interceptor connected to it: "
                  f"{fmt_s(base)}", f"{ours / base:.2f}x", "<= 1.2x",
                  ours / base <= 1.2)


def growth_rows(table, g):
    """How transfer time grows: against size (the smallest point scaled
    linearly is the baseline) and against entry count at one size (the
    fewest entries are the baseline; the difference per added entry is the
    per-entry cost)."""
    for what, key in (("GetStateDict", "get_s"), ("LoadStateDict", "load_s")):
        first = g["size"][0]
        per_byte = first[key] / first["bytes"]
        for point in g["size"][1:]:
            n, ours = point["bytes"], point[key]
            base = per_byte * n
            table.add(f"{what} cost by size: {n / MIB:.0f} MiB "
                      f"({point['entries']} entries; modelstatectl, "
                      f"{g.get('transport', 'gRPC messages')})",
                      f"{fmt_s(ours)} ({rate(n, ours)})",
                      f"{first['bytes'] / MIB:.0f} MiB's rate, scaled: "
                      f"{fmt_s(base)}", f"{ours / base:.2f}x", "reported",
                      None)
        few = g["entries"][0]
        for point in g["entries"][1:]:
            ours = point[key]
            extra = (ours - few[key]) / (point["entries"] - few["entries"])
            table.add(f"{what} cost by entries: {point['entries']:,} tensors,"
                      f" {point['bytes'] / MIB:.0f} MiB in all (modelstatectl, "
                      f"{g.get('transport', 'gRPC messages')})",
                      f"{fmt_s(ours)}",
                      f"{few['entries']} tensors, same bytes: "
                      f"{fmt_s(few[key])}; {extra * 1e6:+.1f} us per added "
                      f"tensor", f"{ours / few[key]:.2f}x", "reported", None)


def cuda_section(results):
    """BENCHMARKS.md's CUDA section from cuda_bench's JSON: its own table,
    since a GPU host may not be the machine of the main run; every ratio
    against a baseline of the same cuda_bench run. None without figures."""
    cuda = bench_medians(results)
    if "BM_RawPinnedH2D" not in cuda:
        return None
    context = results.get("context", {})

    def gbps(name):
        return cuda[name]["bytes_per_second"] / 1e9

    table = Table()
    link = {"up": gbps("BM_RawPinnedH2D"), "down": gbps("BM_RawPinnedD2H")}
    mib = cuda["BM_RawPinnedH2D"]["bytes_per_second"] * seconds(
        cuda["BM_RawPinnedH2D"]) / 2**20
    sweep = sorted(
        (int(name.split(":")[1]), name) for name in cuda
        if name.startswith("BM_StagedUpload/threads:"))
    for ours, direction, what in (
            ("BM_ToH2D", "up", "host -> device"),
            ("BM_ToD2H", "down", "device -> host, into a new tensor")):
        if ours in cuda:
            ratio = gbps(ours) / link[direction]
            table.add(f"Tensor.to(), {what} ({mib:.0f} MiB)",
                      f"{gbps(ours):.2f} GB/s",
                      f"raw cudaMemcpy from/to pinned memory "
                      f"{link[direction]:.2f} GB/s", f"{ratio:.2f}x",
                      ">= 0.9x", ratio >= 0.9)
    for prefix, direction in (("BM_StagedUpload", "up"),
                              ("BM_StagedDownload", "down")):
        rates = ", ".join(
            f"{n}: {gbps(f'{prefix}/threads:{n}'):.1f}" for n, _ in sweep
            if f"{prefix}/threads:{n}" in cuda)
        best = max(gbps(f"{prefix}/threads:{n}") for n, _ in sweep)
        what = "host -> device" if direction == "up" else "device -> host"
        table.add(f"  staged copies alone, {what}, by staging threads (GB/s; "
                  "host memory already faulted in)",
                  rates, f"raw {link[direction]:.2f} GB/s",
                  f"best {best / link[direction]:.2f}x", "(breakdown)", None)
    if "BM_PinThenCopyH2D" in cuda:
        table.add("  the alternative to staging: pin the buffer for the "
                  "copy (cudaHostRegister, cudaMemcpy, unregister)",
                  f"{gbps('BM_PinThenCopyH2D'):.2f} GB/s",
                  f"Tensor.to() {gbps('BM_ToH2D'):.2f} GB/s",
                  f"{gbps('BM_PinThenCopyH2D') / gbps('BM_ToH2D'):.2f}x",
                  "(breakdown)", None)
    if "BM_NewHostTensor" in cuda and "BM_ToD2H" in cuda:
        fresh, down = seconds(cuda["BM_NewHostTensor"]), seconds(
            cuda["BM_ToD2H"])
        table.add("  for scale: one thread writing a new host tensor of the "
                  "same bytes (its page faults; a download spreads them over "
                  "its staging threads)", fmt_s(fresh),
                  f"Tensor.to() device -> host {fmt_s(down)}",
                  f"{fresh / down:.2f}x", "(breakdown)", None)
    if "BM_StreamStateDict/cuda" in cuda:
        ratio = gbps("BM_StreamStateDict/cuda") / gbps(
            "BM_StreamStateDict/cpu")
        table.add("state_dict stream from a GPU module (1 MiB chunks)",
                  f"{gbps('BM_StreamStateDict/cuda'):.2f} GB/s",
                  f"same module on cpu "
                  f"{gbps('BM_StreamStateDict/cpu'):.2f} GB/s",
                  f"{ratio:.2f}x", ">= 0.85x", ratio >= 0.85)
    missed = [r[0].strip() for r in table.rows if r[5] == "**no**"]
    return "\n".join([
        "## CUDA",
        "",
        f"- GPU: {context.get('gpu', 'unnamed')}, CUDA driver "
        f"{context.get('cuda_driver', '?')}; host: "
        f"{context.get('num_cpus', '?')} CPUs",
        f"- measured: {context.get('date', '?')} by `cuda_bench` on that "
        "host (medians of its repetitions; baselines from the same run)",
        "",
        table.markdown(),
        "CUDA targets missed: " + ("; ".join(missed) if missed else "none")
        + ".",
        "",
    ])


def audit_rows(table, a):
    """The audit log (audit_bench): appends with a checkpoint each second
    against a plain file, proofs at scale, restart against an empty log."""
    x = a["appends"]
    ours, raw = x["audit_per_s_median"], x["raw_per_s_median"]
    table.add(f"audit appends, {x['threads']} threads, sync every "
              f"{x['sync_every']}, a signed checkpoint each second",
              f"{ours:,.0f} records/s", f"plain file, same writes and "
              f"fdatasyncs: {raw:,.0f}/s", f"{ours / raw:.2f}x",
              ">= 10,000/s", ours >= 10000)
    p = a["proofs"]
    for kind in ("inclusion", "consistency"):
        us = p[f"{kind}_us_median"]
        table.add(f"{kind} proof at {p['records']:,} records", f"{us:.0f} us",
                  "-", "-", "< 1 ms", us < 1000)
    r, e, c = a["restart"], a["restart_empty"], a["restart_after_crash"]
    table.add(f"restart (clean close) at {r['records']:,} records",
              fmt_s(r["open_s"]), f"empty log {fmt_s(e['open_s'])}",
              f"{r['open_s'] / max(e['open_s'], 1e-6):.1f}x", "< 1 s",
              r["open_s"] < 1)
    growth = r["rss_growth_bytes"] - e["rss_growth_bytes"]
    table.add(f"restart memory at {r['records']:,} records, more than "
              "an empty log", f"{growth / MIB:.1f} MiB",
              f"empty log {e['rss_growth_bytes'] / MIB:.1f} MiB", "-",
              "< 100 MB", growth < 100e6)
    crash_growth = c["rss_growth_bytes"] - e["rss_growth_bytes"]
    table.add(f"restart after a crash at {c['records']:,} records (the "
              "unindexed tail read)", fmt_s(c["open_s"]),
              f"empty log {fmt_s(e['open_s'])}",
              f"{c['open_s'] / max(e['open_s'], 1e-6):.1f}x", "< 1 s",
              c["open_s"] < 1)
    table.add(f"restart memory after a crash, more than an empty log",
              f"{crash_growth / MIB:.1f} MiB",
              f"empty log {e['rss_growth_bytes'] / MIB:.1f} MiB", "-",
              "< 100 MB", crash_growth < 100e6)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--core", required=True)
    parser.add_argument("--torch", required=True)
    parser.add_argument("--transfer", required=True)
    parser.add_argument("--forward")
    parser.add_argument("--torch-forward")
    parser.add_argument("--cuda", help="optional: cuda_bench's JSON (from "
                        "this machine or a GPU host)")
    parser.add_argument("--python-transfer",
                        help="optional: python_transfer_bench.py's JSON")
    parser.add_argument("--audit", help="optional: audit_bench's JSON")
    parser.add_argument("--cluster", help="optional: cluster_bench's JSON")
    parser.add_argument("--growth", help="optional: growth_bench's JSON")
    parser.add_argument("--checks")
    parser.add_argument("--torch-model", default="gpt2",
                        help="torch_bench's model that core_bench built"
                        " (mlp in smoke runs)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    core = bench_medians(load(args.core))
    torch_results = load(args.torch)
    transfer = load(args.transfer)
    table = Table()
    transfer_rows(table, transfer)
    hook_rows(table, transfer, torch_results)
    core_rows(table, core, torch_results, args.torch_model)
    concurrency_rows(table, transfer)
    idle_latency_rows(table, transfer)
    shared_memory_rows(table, transfer)
    mapped_rows(table, transfer)
    if args.python_transfer:
        python_rows(table, load(args.python_transfer))
    restore_rows(table, transfer)
    attest_rows(table, transfer)
    if args.forward:
        forward_rows(table, bench_medians(load(args.forward)),
                     load(args.torch_forward) if args.torch_forward else None)
    if args.audit:
        audit_rows(table, load(args.audit))
    if args.cluster:
        cluster_rows(table, load(args.cluster))
    if args.growth:
        growth_rows(table, load(args.growth))

    reps = core.get("BM_LoadStateDictCopy", {}).get("repetitions", 1)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `deploy/bench.sh` (do not edit by hand). Every ratio "
        "compares medians measured in the same run on the same machine.",
        "",
        f"- machine: {machine()}",
        f"- date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"- repetitions: transfer/hooks {transfer['reps']} after "
        f"{transfer['warmup']} warm-up (baseline and measured runs "
        f"interleaved); core {reps} (Google Benchmark, random "
        f"interleaving); PyTorch {torch_results['reps']} after "
        f"{torch_results['warmup']} warm-up, "
        f"{torch_results['threads']} thread(s)",
        f"- ping-pong (bare gRPC bidi stream): p50 "
        f"{transfer['ping_pong']['p50_us']:.0f} us, p99 "
        f"{transfer['ping_pong']['p99_us']:.0f} us",
        "",
        table.markdown(),
    ]
    missed = [r[0].strip() for r in table.rows if r[5] == "**no**"]
    lines.append("Targets missed in this run: " +
                 ("; ".join(missed) if missed else "none") + ".")
    lines.append("")
    if args.cuda and os.path.exists(args.cuda):
        section = cuda_section(load(args.cuda))
        if section:
            lines.append(section)
    if args.checks:
        with open(args.checks) as f:
            lines.append(f.read().rstrip() + "\n")
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
