#!/usr/bin/env python3
"""Checks the server's layering: no file includes a layer above its own.

Layers, lowest first (docs/design.md draws them):
  kernels/            the kernels: nothing from server/, no gRPC, no protobuf
  server/exec/        Op, OpCall, OpTiming, the Backend seam, the work queue (kernels: dtypes,
                      the parallel host copy)
  server/backends/X/  one backend: exec and kernels (and its own folder)
  server/core/        request checks, in-flight accounting, the tensor store: exec, protobuf messages
  server/rpc/         handlers, reactors, auth, metrics: core, exec, gRPC
  server/*.cc|h       the assembly: anything in server/
gRPC headers (grpcpp/, grpc/, *.grpc.pb.h) appear only in server/rpc/ and the assembly (and in
clients, tests and benchmarks, which are not layers of the server).

Usage: check_layers.py [ROOT]   exits 1 and lists each violation, else prints a summary.
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
GRPC = re.compile(r'^(grpcpp/|grpc/|grpc\+\+/)|\.grpc\.pb\.h$')
PROTO_MSG = re.compile(r'^fusebox/v\d+/.*\.pb\.h$')

# Folder -> the first-party include prefixes it may use, and whether gRPC / protobuf messages.
RULES = [
    ("kernels/", ("kernels/",), False, False),
    ("server/exec/", ("server/exec/", "kernels/dtype.h", "kernels/cpu/parallel_copy.h"), False, False),
    ("server/backends/cpu/", ("server/exec/", "server/backends/cpu/", "kernels/"), False, False),
    ("server/backends/cuda/", ("server/exec/", "server/backends/cuda/", "kernels/"), False, False),
    ("server/core/", ("server/exec/", "server/core/", "kernels/dtype.h"), False, True),
    ("server/rpc/", ("server/exec/", "server/core/", "server/rpc/", "kernels/dtype.h"), True, True),
    ("server/", ("server/", "kernels/"), True, True),
]
FIRST_PARTY = ("server/", "kernels/", "client/", "bench/", "lab/", "tests/", "proto/")
SOURCES = {".h", ".cc", ".cu", ".cuh", ".inc"}


def rule_for(rel):
    for prefix, allowed, grpc_ok, proto_ok in RULES:
        if rel.startswith(prefix):
            return prefix, allowed, grpc_ok, proto_ok
    return None


def violations(root):
    found, checked = [], 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.suffix not in SOURCES or not rel.startswith(("server/", "kernels/")):
            continue
        rule = rule_for(rel)
        if rule is None:
            continue
        prefix, allowed, grpc_ok, proto_ok = rule
        checked += 1
        for inc in INCLUDE.findall(path.read_text(errors="replace")):
            if GRPC.search(inc):
                if not grpc_ok:
                    found.append(f"{rel}: includes gRPC ({inc}); only server/rpc/ and the assembly may")
            elif PROTO_MSG.match(inc):
                if not proto_ok:
                    found.append(f"{rel}: includes protobuf messages ({inc}); {prefix} may not")
            elif inc.startswith(FIRST_PARTY) and not inc.startswith(allowed):
                found.append(f"{rel}: includes {inc}, a layer {prefix} may not use")
    return found, checked


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[1])
    found, checked = violations(root.resolve())
    for v in found:
        print(v)
    if checked == 0:
        print("check_layers: no sources found under", root)
        return 1
    print(f"check_layers: {checked} files, {len(found)} violations")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
