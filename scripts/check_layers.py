#!/usr/bin/env python3
"""Layer check: fails when a module imports one above it (DESIGN.md, "Layers").

Reads every `crate::<module>` path in src/ (library code only: `tests.rs`, `*_tests.rs`
and what follows a `#[cfg(test)]` module are test code, and comments are skipped) and
compares the two modules' layers below. An import is allowed when the imported module's
layer is lower, or when both are in one layer that says its modules may use each other
(with the reason). Everything else is an error, unless listed in KNOWN, the import
circles that remain to be taken apart (issue 27); an entry that no longer occurs is
reported so that it gets deleted.

Run: python3 scripts/check_layers.py  (exit 1 on a new violation).
"""
import os
import re
import sys

# Lowest first. A layer is (modules, reason they may use each other or None).
LAYERS = [
    (["util", "bufpool", "trace_context"], None),
    (["error", "protocol"], "crate::Error carries the protocol's ErrorCode, and the codec returns crate::Error"),
    (["compression"], None),
    (["record"], None),
    (["conn", "tls", "sasl"], "TLS and SASL are steps of a connection's handshake and run over it"),
    (["cluster"], None),
    (["metrics"], None),  # feature `metrics`: latency counters and the publishing loop
    (["common", "ack"], None),  # TopicPartition, StartOffset, the retry policy: below reader/group/writer
    (["admin"], None),
    (["coordinator"], None),  # FindCoordinator + dedicated connections: groups, share groups, transactions
    (["writer"], None),
    (["group"], None),
    (["reader"], None),
    (["eos"], None),  # the exactly-once pipeline: joins a group reader's handle and a transactional writer
    (["share"], None),
    (["config"], None),  # property maps → Reader/Writer/Admin configs: above all of them
    (["mock"], None),  # test support: may use everything
]

# Re-exports that keep a public path after its item moved up a layer: allowed only as a
# `pub use crate::<imported>::...` line (a name, not a use of the code), each one
# justified in DESIGN.md ("Layers").
REEXPORTS = {
    ("writer", "eos"),  # writer::{ExactlyOnceSink, PipelineConfig, PipelineStats}
}

# Remaining upward imports (importer -> imported), to be removed; see issue 27.
KNOWN = {
    ("group", "reader"),
}

RANK = {}
SHARED = {}
for i, (mods, reason) in enumerate(LAYERS):
    for m in mods:
        RANK[m] = i
        SHARED[m] = reason

PUB_USE = re.compile(r"^\s*pub use crate::")
USE = re.compile(r"crate::(\{[^}]*\}|\w+)")


def modules_in(path_expr):
    if path_expr.startswith("{"):
        return re.findall(r"(?:^|,)\s*(\w+)", path_expr[1:-1])
    return [path_expr]


def library_lines(text):
    """The file's lines up to its `#[cfg(test)] mod ...` (if any), comments dropped."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("#[cfg(test)]") and i + 1 < len(lines) and re.match(
            r"\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", lines[i + 1]
        ):
            break
        if s.startswith("//"):
            continue
        out.append((i + 1, line.split("//")[0]))
    return out


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    seen = {}
    reexported = set()
    errors = []
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".rs") or name == "tests.rs" or name.endswith("_tests.rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            top = rel.split(os.sep)[0].removesuffix(".rs")
            if top in ("lib", "bin"):
                continue
            if top not in RANK:
                errors.append(f"src/{rel}: module `{top}` has no layer in scripts/check_layers.py")
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for lineno, line in library_lines(text):
                for m in USE.finditer(line):
                    for dep in modules_in(m.group(1)):
                        if dep == top or dep not in RANK:
                            continue  # same module, or a crate-root item (Error, Result)
                        if RANK[dep] < RANK[top]:
                            continue
                        if RANK[dep] == RANK[top] and SHARED[top]:
                            continue
                        if (top, dep) in REEXPORTS and PUB_USE.match(line):
                            reexported.add((top, dep))
                            continue
                        seen.setdefault((top, dep), f"src/{rel}:{lineno}")
    for edge, where in sorted(seen.items()):
        if edge not in KNOWN:
            errors.append(f"{where}: `{edge[0]}` imports `{edge[1]}`, a module of its own or a higher layer")
    for a, b in sorted(REEXPORTS - reexported):
        print(f"note: the re-export `{a}` -> `{b}` no longer occurs; delete it from REEXPORTS")
    stale = sorted(KNOWN - set(seen))
    for a, b in stale:
        print(f"note: `{a}` -> `{b}` no longer occurs; delete it from KNOWN")
    print(f"layers: {len(seen)} upward import(s), {len(KNOWN & set(seen))} known")
    for e in errors:
        print(f"error: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
