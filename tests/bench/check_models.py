"""The benchmark specs (models/*.json) must build what PyTorch builds.

For each model, modelstate builds the spec file with tests/tools/
dump_state_dict, and PyTorch builds bench_models.MODELS[name]() after
torch.manual_seed(seed). Both must have the same state_dict keys in the
same order, shapes, dtypes and bytes, the same _metadata versions, the same
named_modules() paths and types and the same requires_grad flags.

Default (quick, about 5 s): mlp and resnet50 are compared in full.
gpt2 and linear64 are too big to dump quickly (the tool prints every byte
as hex: about 17 s and 1.3 GB for gpt2), so they are compared at reduced
width: each integer constructor argument of the spec file found in
REDUCED's table is replaced (768 -> 8, 50257 -> 37, ...), and the result is
compared, everything above bit for bit, with the PyTorch model built with
the matching small config. Depth and the whole module tree are kept, so
every key is checked. The table is one to one and applies to arguments
only (a file that already holds a reduced size is an error), so a wrong
or misplaced size in the file still shows up as a shape mismatch; only
values at full width go unchecked.

--full: every model at full size, bit for bit (about 45 s and 4 GB of
memory on a 2-core machine; gpt2 alone takes 30 s).

Usage (Debian's /usr/bin/python3, which has torch 1.13):
    check_models.py DUMP_STATE_DICT_BINARY MODELS_DIR [--full]
        [--models mlp,gpt2] [--seed N]
Exit status 0 if all match, 1 otherwise (the differences are printed).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import MODELS  # pylint: disable=wrong-import-position

# name -> (full size -> reduced size, reduced factory kwargs). The sizes
# derived from gpt2's d (3 d, 4 d) are scaled with it.
REDUCED = {
    "gpt2": ({50257: 37, 1024: 11, 768: 8, 2304: 24, 3072: 32},
             {"vocab": 37, "n_ctx": 11, "d": 8}),
    "linear64": ({1024: 16}, {"width": 16}),
}

MAX_REPORTED = 8  # Differences printed per model.


def reduce_spec(spec, sizes):
    """A copy of spec with the int args and kwargs in `sizes` replaced."""

    def scale(v):
        if isinstance(v, list):
            return [scale(x) for x in v]
        if isinstance(v, int) and not isinstance(v, bool):
            # A size already equal to a reduced one would alias it.
            if v in sizes.values():
                raise ValueError(f"size {v} is ambiguous in reduce_spec")
            return sizes.get(v, v)
        return v

    out = dict(spec)
    if "args" in spec:
        out["args"] = scale(spec["args"])
    if "kwargs" in spec:
        out["kwargs"] = {k: scale(v) for k, v in spec["kwargs"].items()}
    if "children" in spec:
        out["children"] = [{**c, "spec": reduce_spec(c["spec"], sizes)}
                           for c in spec["children"]]
    if "members" in spec:
        out["members"] = [
            {"module": {**m["module"],
                        "spec": reduce_spec(m["module"]["spec"], sizes)}}
            if "spec" in m.get("module", {}) else m
            for m in spec["members"]]
    return out


def modelstate_dump(tool, spec, seed):
    request = [{"spec": spec, "seed": seed, "dtype": "float32"}]
    out = subprocess.run([tool], input=json.dumps(request).encode(),
                         stdout=subprocess.PIPE, check=True).stdout
    return json.loads(out)[0]


def torch_dump(model):
    sd = model.state_dict()
    return {
        "state_dict": [
            {"key": k, "dtype": str(v.dtype).replace("torch.", ""),
             "shape": list(v.shape), "tensor": v}
            for k, v in sd.items()],
        "metadata": {k: v["version"] for k, v in sd._metadata.items()},
        "named_modules": [[n, type(m).__name__]
                          for n, m in model.named_modules()],
        "requires_grad": {n: p.requires_grad
                          for n, p in model.named_parameters()},
    }


def tensor_bytes(t):
    return t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def describe_difference(ours_hex, theirs):
    """Where two same-shaped tensors differ, as one line."""
    ours = torch.frombuffer(bytearray.fromhex(ours_hex), dtype=theirs.dtype)
    flat = theirs.reshape(-1)
    diff = (ours != flat).nonzero()
    if not len(diff):  # Equal values, different bytes (-0.0, NaN payload).
        return "bytes differ"
    i = int(diff[0])
    return (f"{len(diff)} of {flat.numel()} elements differ, first at flat"
            f" index {i}: modelstate {ours[i].item()!r},"
            f" torch {flat[i].item()!r}")


def first_difference(name, ours, theirs):
    """Where two lists or dicts differ, as one line (None if equal)."""
    if ours == theirs:
        return None
    if isinstance(ours, dict):
        only_ours = sorted(set(ours) - set(theirs))
        only_theirs = sorted(set(theirs) - set(ours))
        changed = sorted(k for k in set(ours) & set(theirs)
                         if ours[k] != theirs[k])
        return (f"{name}: only in modelstate {only_ours[:5]}, only in torch"
                f" {only_theirs[:5]}, different {changed[:5]}")
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
             min(len(ours), len(theirs)))

    def at(items):
        return items[i] if i < len(items) else "(end)"

    return (f"{name}: {len(ours)} vs {len(theirs)} items, first difference"
            f" at #{i}: modelstate {at(ours)}, torch {at(theirs)}")


def compare(ours, theirs):
    """The differences between two dumps, as lines (none if equal)."""
    if "error" in ours:
        return [f"modelstate error: {ours['error']}"]
    problems = [first_difference(field, ours[field], theirs[field])
                for field in ("metadata", "named_modules", "requires_grad")]
    problems = [p for p in problems if p]
    keys = first_difference("state_dict keys",
                            [e["key"] for e in ours["state_dict"]],
                            [e["key"] for e in theirs["state_dict"]])
    if keys:
        return problems + [keys]
    for a, b in zip(ours["state_dict"], theirs["state_dict"]):
        where = b["key"]
        if a["dtype"] != b["dtype"] or a["shape"] != b["shape"]:
            problems.append(f"{where}: modelstate {a['dtype']}{a['shape']},"
                            f" torch {b['dtype']}{b['shape']}")
        elif bytes.fromhex(a["hex"]) != tensor_bytes(b["tensor"]):
            problems.append(f"{where}: "
                            f"{describe_difference(a['hex'], b['tensor'])}")
    return problems


def check(tool, models_dir, name, seed, full):
    with open(os.path.join(models_dir, name + ".json")) as f:
        spec = json.load(f)
    kwargs = {}
    label = name
    if not full and name in REDUCED:
        sizes, kwargs = REDUCED[name]
        spec = reduce_spec(spec, sizes)
        label = f"{name} (reduced: {kwargs})"
    start = time.perf_counter()
    ours = modelstate_dump(tool, spec, seed)
    torch.manual_seed(seed)
    theirs = torch_dump(MODELS[name](**kwargs))
    problems = compare(ours, theirs)
    elapsed = time.perf_counter() - start
    if problems:
        # Once one draw differs, all later values do: show the first few.
        for p in problems[:MAX_REPORTED]:
            print(f"FAIL {label} seed={seed}: {p}")
        if len(problems) > MAX_REPORTED:
            print(f"FAIL {label} seed={seed}: ... and"
                  f" {len(problems) - MAX_REPORTED} more differences")
    else:
        numel = sum(e["tensor"].numel() for e in theirs["state_dict"])
        print(f"ok   {label} seed={seed}: {len(theirs['state_dict'])}"
              f" entries, {numel:,} elements bit-exact ({elapsed:.1f} s)")
    return not problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tool", help="path to dump_state_dict")
    parser.add_argument("models_dir", help="directory of NAME.json specs")
    parser.add_argument("--full", action="store_true",
                        help="compare gpt2 and linear64 at full size too")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated names (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {list(MODELS)}")
    failed = [n for n in names
              if not check(args.tool, args.models_dir, n, args.seed,
                           args.full)]
    print(f"{len(names) - len(failed)} of {len(names)} models match torch"
          f" {torch.__version__}" + (f"; mismatched: {failed}" if failed
                                     else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
