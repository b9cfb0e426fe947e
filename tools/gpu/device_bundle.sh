#!/usr/bin/env bash
# Packs built executables and modules, plus the shared libraries they need that
# the GPU machine lacks (gRPC, protobuf, abseil, prometheus-cpp, ...), into
# $BUNDLE_DIR (default .bundle/) so the device tool can carry it (`carry: [".bundle"]`)
# and run it with LD_LIBRARY_PATH=.bundle/lib:/usr/local/cuda/lib64 after unpacking
# .bundle/lib.tgz (tar -C .bundle -xzf .bundle/lib.tgz). System libraries,
# the C++ runtime and CUDA's own (cudart, cuBLAS) are left to that machine.
# The device tool carries at most 64 MiB, the working tree included: one bundle per job.
#
# usage: [BUNDLE_DIR=.bundle-x] tools/gpu/device_bundle.sh FILE... (executables or .so files;
#        scripts and directories copied as they are)
set -euo pipefail
out=${BUNDLE_DIR:-.bundle}
rm -rf "$out"; mkdir -p "$out/bin" "$out/lib"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|libcublas|libcudart|libcuda\.so)'
for f in "$@"; do
  if [[ -d $f ]]; then cp -rL "$f" "$out/bin/"; continue; fi
  cp -L "$f" "$out/bin/"
  if file -L "$f" | grep -q ELF; then
    ldd "$f" | awk '/=> \// {print $1, $3}' | while read -r name path; do
      [[ "$name" =~ $skip ]] && continue
      cp -Ln "$path" "$out/lib/" 2>/dev/null || true
    done
  fi
done
# The device tool carries at most 64 MiB: past 48 MB ship the libraries gzipped
# (OpenBLAS alone is 35 MB; BUNDLE_GZIP=0 never packs); run scripts then unpack them first:
#   [[ -f $B/lib.tgz ]] && tar -C $B -xzf $B/lib.tgz
if [[ ${BUNDLE_GZIP:-auto} != 0 ]] && (( $(du -sm "$out" | cut -f1) > 48 )); then
  tar -C "$out" -czf "$out/lib.tgz" lib && rm -rf "$out/lib"
fi
du -sh "$out" | awk -v d="$out" '{print "bundle " d ": " $1}'
