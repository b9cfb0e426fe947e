#!/bin/bash
# The tile kernels' elements per lane (tile_elems 4 / 8 / 16) on the sweep's worst short-row
# shapes, in one process beside the copy ceiling and the peers (run_device.sh ab), after the tile
# test (every row length 1-64, every tile_elems). On the device, from the repository root, with
# the kernels bundle carried: bash lab/probes/tile_elems_ab.sh
set -u
B=.bundle-kernels
OUT=${OUT:-/tmp/fusebox-out} AB="$(cat lab/probes/tile_elems_ab.args)" BUNDLE=$B bash $B/bin/run_device.sh ab |
  tail -n 60
LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64 $B/bin/fusebox_gpu_kernels_test --gtest_filter='*ShortRowTiles*' \
  --gtest_brief=1 2>&1 | tail -n 8
