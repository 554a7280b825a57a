#!/usr/bin/env python3
"""Fails if a folder includes a higher layer, or if headers include each
other in a cycle (README "Layout"). Usage: check_layers.py SOURCE_ROOT"""
import os
import re
import sys

# Lower layers first; each may include only itself and the layers before it.
# proto/, server/ and client/ sit on top and may include anything below.
LAYERS = ["base", "core", "nn", "service", "cluster"]
TOP = ["proto", "server", "client"]
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
                if i.split("/")[0] in LAYERS + TOP]


def main(root):
    problems = []
    graph = {}
    for rank, folder in enumerate(LAYERS + TOP):
        allowed = set(LAYERS[:rank + 1]) if folder in LAYERS else None
        for path in sources(root, folder):
            incs = includes(root, path)
            graph[path] = [i for i in incs if i.endswith(".h")]
            if allowed is None:
                continue
            for inc in incs:
                if inc.split("/")[0] not in allowed:
                    problems.append(f"{path} includes {inc}: {folder}/ may "
                                    f"include only {sorted(allowed)}")
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
