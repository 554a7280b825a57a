#!/usr/bin/env python3
"""Fails if a folder includes a higher layer or one README "Layout" rules
out for it (cluster/ past base; the client side past base, core, proto's
convert and the audit library), or if headers include each other in a
cycle. Usage: check_layers.py SOURCE_ROOT"""
import os
import re
import sys

# Lower layers first; each may include only itself and the layers before it.
LAYERS = ["base", "core", "nn", "service"]
# The rest, with what README "Layout" lets each include. cluster/ keeps its
# state in etcd and knows nothing of models: base only. The client side
# (client/ and proto/convert) links neither the layer library nor the
# service: of service/ only the audit library (modelstate_audit, base only),
# so that modelstatectl can verify a log offline. server/ may use anything
# but the client.
CLIENT_SIDE = {"base", "core", "proto", "client"}
AUDIT_LIBRARY = {"service/audit_index.h", "service/audit_log.h",
                 "service/audit_record.h", "service/audit_tree.h"}
SERVER_ONLY = {"proto/service_convert.h"}
OTHERS = {
    "cluster": {"base", "cluster"},
    "proto": set(LAYERS) | {"proto"},  # convert.* is narrowed below
    "client": CLIENT_SIDE,
    "server": set(LAYERS) | {"cluster", "proto", "server"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root, folder):
    for dirpath, _, names in os.walk(os.path.join(root, folder)):
        for name in names:
            if name.endswith((".h", ".cc", ".cu")):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root)


def includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return [i for i in INCLUDE.findall(f.read())
                if i.split("/")[0] in LAYERS + list(OTHERS)]


def allowed_include(path, folder, inc):
    """None if PATH (in FOLDER) may include INC, else why not."""
    top = inc.split("/")[0]
    if folder in LAYERS:
        allowed = set(LAYERS[:LAYERS.index(folder) + 1])
    else:
        allowed = OTHERS[folder]
    client_side = folder == "client" or path.startswith("proto/convert.")
    if client_side:
        allowed = CLIENT_SIDE
        if inc in AUDIT_LIBRARY:
            return None
        if inc in SERVER_ONLY:
            return (f"{inc} is the server's; the client side may include "
                    f"only proto/convert.h")
    if path in AUDIT_LIBRARY or path.replace(".cc", ".h") in AUDIT_LIBRARY:
        if top != "base" and inc not in AUDIT_LIBRARY:
            return "the audit library (modelstate_audit) is base only"
    if top not in allowed:
        what = "the client side" if client_side else f"{folder}/"
        return (f"{what} may include only {sorted(allowed)}"
                + (" and the audit library" if client_side else ""))
    return None


def main(root):
    problems = []
    graph = {}
    for folder in LAYERS + list(OTHERS):
        for path in sources(root, folder):
            incs = includes(root, path)
            graph[path] = [i for i in incs if i.endswith(".h")]
            for inc in incs:
                why = allowed_include(path, folder, inc)
                if why is not None:
                    problems.append(f"{path} includes {inc}: {why}")
    # A cycle among headers (a .cc is never included, so cycles are found
    # between headers, through the includes of each header only).
    state = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                problems.append("include cycle: " + " -> ".join(cycle))
            elif nxt in graph and state.get(nxt) is None:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node.endswith(".h") and state.get(node) is None:
            visit(node, [node])
    for p in problems:
        print(p)
    print(f"checked {len(graph)} files: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
