#!/usr/bin/env python3
"""Checks that the daemon's folders include each other only as docs/architecture.md says.

    scripts/check_layers.py [ROOT]       check the tree at ROOT (default: this repository)
    scripts/check_layers.py --self-test  check that every kind of offence is reported

Reads every `#include "..."` of the C and CUDA sources and headers under daemon/, api/,
kernels/ and client/, resolves it (first beside the including file, then from ROOT, as the
build's include paths do) and reports, one line each as `file:line: includes X (why)`:

- an include of a higher layer. The layers, lowest first: kernels/ and daemon/util/ (0),
  daemon/job/ and daemon/auth/ (1), daemon/store/ (2), daemon/exec/ (3), daemon/sched/ (4), api/ (5) and
  daemon/main.c (6). daemon/util/ is a toolbox that includes nothing else of ours, not even
  kernels/;
- an include of another folder's private header. Each folder's public headers are its
  contract: daemon/job/job.h, daemon/auth/auth.h, daemon/store/store.h, daemon/exec/executor.h,
  daemon/sched/scheduler.h, api/api.h, every header of daemon/util/, and kernels/op.h and
  kernels/tensor.h. Within a folder any header may be included; daemon/main.c, which wires
  everything together, may include any header;
- a file of client/ that includes anything of daemon/ or api/ (the client library speaks
  HTTP only);
- a file under daemon/ that belongs to no layer (a new folder must be given its place here);
- a cycle in the include graph between files.

Exits 0 and prints "check_layers: N files, M includes, 0 offences" when there are none;
otherwise lists them and exits 1. Standard library only."""
import os
import re
import sys
import tempfile

SOURCE_EXTS = (".c", ".h", ".cu", ".cuh", ".cpp", ".hpp")
CHECKED_DIRS = ("daemon", "api", "kernels", "client")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')

# Folder (relative to the root) -> (layer name, rank). The longest matching prefix wins.
LAYERS = {
    "kernels": ("kernels", 0),
    "daemon/util": ("util", 0),
    "daemon/job": ("job", 1),
    "daemon/auth": ("auth", 1),
    "daemon/store": ("store", 2),
    "daemon/exec": ("exec", 3),
    "daemon/sched": ("sched", 4),
    "api": ("api", 5),
}
MAIN = "daemon/main.c"
PUBLIC_HEADERS = {
    "daemon/job/job.h",
    "daemon/auth/auth.h",
    "daemon/store/store.h",
    "daemon/exec/executor.h",
    "daemon/sched/scheduler.h",
    "api/api.h",
    "kernels/op.h",
    "kernels/tensor.h",
}
PUBLIC_FOLDERS = {"daemon/util"}  # every header in these folders is public


def layer_of(path):
    """(folder, layer name, rank) of a path relative to the root, or None outside the layers."""
    if path == MAIN:
        return ("daemon", "main", 6)
    best = None
    for folder, (name, rank) in LAYERS.items():
        if path.startswith(folder + "/") and (best is None or len(folder) > len(best[0])):
            best = (folder, name, rank)
    return best


def is_public(header):
    return header in PUBLIC_HEADERS or os.path.dirname(header) in PUBLIC_FOLDERS or any(
        header.startswith(folder + "/") for folder in PUBLIC_FOLDERS)


def source_files(root):
    """Every C/CUDA source and header under the checked folders, relative to root, sorted."""
    found = []
    for top in CHECKED_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in filenames:
                if name.endswith(SOURCE_EXTS):
                    found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(p.replace(os.sep, "/") for p in found)


def resolve(root, includer, spelled):
    """The included file relative to root, or None when it is not ours (a system header)."""
    for base in (os.path.dirname(includer), ""):
        candidate = os.path.normpath(os.path.join(base, spelled)).replace(os.sep, "/")
        if not candidate.startswith("..") and os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def read_includes(root, path):
    """[(line number, spelled name, resolved path or None)] of one file."""
    found = []
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                found.append((number, m.group(1), resolve(root, path, m.group(1))))
    return found


def layer_offence(path, target):
    """Why path may not include target (both relative to root), or None when it may."""
    if path.startswith("client/"):
        if target.startswith(("daemon/", "api/")):
            return "client/ may not include daemon/ or api/: it speaks HTTP only"
        return None
    if path == MAIN:
        return None
    src, dst = layer_of(path), layer_of(target)
    if src is None or dst is None:
        return None  # reported once per file by check(), or not ours to judge
    if src[0] == dst[0]:
        return None
    if src[1] == "util":
        return f"layer util may not include layer {dst[1]}: it includes nothing else of ours"
    if dst[2] > src[2]:
        return f"layer {src[1]} may not include layer {dst[1]}"
    if not is_public(target):
        return f"{target} is private to {dst[0]}/; its public header is the contract"
    return None


def find_cycles(graph):
    """Each cycle of the include graph once, as a list of files [a, b, ..., a]."""
    cycles, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def check(root):
    """(files, includes, offences) of the tree at root; each offence is one report line."""
    files = source_files(root)
    offences, graph, lines, n_includes = [], {}, {}, 0
    for path in files:
        if path.startswith("daemon/") and layer_of(path) is None:
            offences.append(f"{path}:1: is in no layer (give its folder a place in "
                            f"scripts/check_layers.py and docs/architecture.md)")
        graph[path] = []
        for number, spelled, target in read_includes(root, path):
            n_includes += 1
            if target is None:
                if path.startswith("client/") and spelled.startswith(("daemon/", "api/")):
                    offences.append(f"{path}:{number}: includes {spelled} (client/ may not "
                                    f"include daemon/ or api/: it speaks HTTP only)")
                continue
            why = layer_offence(path, target)
            if why:
                offences.append(f"{path}:{number}: includes {spelled} ({why})")
            graph[path].append(target)
            lines.setdefault((path, target), number)
    for cycle in find_cycles(graph):
        a, b = cycle[0], cycle[1]
        offences.append(f"{a}:{lines[(a, b)]}: includes {b} (include cycle: "
                        f"{' -> '.join(cycle)})")
    return len(files), n_includes, offences


def report(root):
    n_files, n_includes, offences = check(root)
    for line in offences:
        print(line)
    print(f"check_layers: {n_files} files, {n_includes} includes, {len(offences)} offences")
    return 1 if offences else 0


def write_tree(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


def self_test():
    """Builds a clean tree and a tree with one of each offence; exits 1 unless the clean one
    passes and every offence in the other is reported."""
    clean = {
        "kernels/op.h": '#include "tensor.h"\n',
        "kernels/tensor.h": "",
        "kernels/gemm.h": '#include "op.h"\n',
        "kernels/gemm.cu": '#include "gemm.h"\n#include <stdio.h>\n',
        "daemon/util/log.h": "",
        "daemon/util/log.c": '#include "log.h"\n',
        "daemon/job/job.h": '#include "daemon/util/log.h"\n#include "kernels/op.h"\n',
        "daemon/store/store.h": '#include "daemon/job/job.h"\n',
        "daemon/store/store_internal.h": '#include "store.h"\n',
        "daemon/store/store.c": '#include "store_internal.h"\n',
        "daemon/exec/executor.h": '#include "daemon/job/job.h"\n',
        "daemon/exec/backend.h": '#include "executor.h"\n',
        "daemon/sched/scheduler.h": '#include "daemon/exec/executor.h"\n'
                                    '#include "daemon/store/store.h"\n',
        "api/api.h": '#include "daemon/sched/scheduler.h"\n',
        "api/handlers/jobs.c": '#include "api/api.h"\n',
        "daemon/main.c": '#include "api/api.h"\n#include "daemon/exec/backend.h"\n',
        "client/gpujob.h": "",
        "client/gpujob.c": '#include "gpujob.h"\n',
    }
    bad = dict(clean)
    bad.update({
        # An upward include: the store reaching for the scheduler.
        "daemon/store/store.c": '#include "store_internal.h"\n'
                                '#include "daemon/sched/scheduler.h"\n',
        # A private header of another folder.
        "daemon/sched/loop.c": '#include "scheduler.h"\n'
                               '#include "daemon/store/store_internal.h"\n',
        # util including kernels, which is the same rank but still not allowed.
        "daemon/util/id.h": '#include "kernels/tensor.h"\n',
        # A cycle between two headers of one folder.
        "daemon/job/a.h": '#include "b.h"\n',
        "daemon/job/b.h": '#include "a.h"\n',
        # The client reaching into the daemon.
        "client/gpujob.c": '#include "gpujob.h"\n#include "daemon/job/job.h"\n',
        # A file outside every layer.
        "daemon/stray.c": "",
    })
    expected = [
        "daemon/store/store.c:2: includes daemon/sched/scheduler.h (layer store may not "
        "include layer sched)",
        "daemon/sched/loop.c:2: includes daemon/store/store_internal.h (daemon/store/"
        "store_internal.h is private to daemon/store/",
        "daemon/util/id.h:1: includes kernels/tensor.h (layer util may not include layer "
        "kernels",
        "daemon/job/a.h:1: includes daemon/job/b.h (include cycle: daemon/job/a.h -> "
        "daemon/job/b.h -> daemon/job/a.h)",
        "client/gpujob.c:2: includes daemon/job/job.h (client/ may not include daemon/",
        "daemon/stray.c:1: is in no layer",
    ]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        write_tree(os.path.join(tmp, "clean"), clean)
        write_tree(os.path.join(tmp, "bad"), bad)
        _, _, found = check(os.path.join(tmp, "clean"))
        if found:
            failures.append("the clean tree reported offences:\n  " + "\n  ".join(found))
        _, _, found = check(os.path.join(tmp, "bad"))
        for want in expected:
            if not any(line.startswith(want) for line in found):
                failures.append(f"not reported: {want}")
        if len(found) != len(expected):
            failures.append(f"{len(found)} offences reported, {len(expected)} expected:\n  "
                            + "\n  ".join(found))
    for line in failures:
        print(f"check_layers self-test: {line}")
    if not failures:
        print(f"check_layers self-test: the clean tree passes, all {len(expected)} offences "
              f"of the other are reported")
    return 1 if failures else 0


def main(argv):
    if len(argv) > 1 and argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    if not os.path.isdir(root):
        print(f"check_layers: '{root}' is not a directory", file=sys.stderr)
        return 2
    return report(root)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
