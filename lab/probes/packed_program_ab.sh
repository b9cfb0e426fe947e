#!/bin/bash
# Row sum's packed kernel (aligned rows of 1-7 16-byte accesses: rows per lane 1 / 2 / 4 / 8, and the
# tile it replaced) and softmax's row program just past its automatic 8 MiB (forced on / off), in one
# process beside the copy ceiling and the peers (run_device.sh ab); and row sum's long rows that
# lost to Triton / eager with clusters of 4-8 (forced 1 and 2 beside the automatic choice). On the device, from the
# repository root, with the kernels bundle carried: bash lab/probes/packed_program_ab.sh
set -u
B=.bundle-kernels
OUT=${OUT:-/tmp/fusebox-out} AB="$(cat lab/probes/packed_program_ab.args)" BUNDLE=$B bash $B/bin/run_device.sh ab |
  tail -n 60
