#!/usr/bin/env bash
# Installs the Debian packages fusebox needs to build, test and demo (idempotent:
# apt-get runs only when something is missing). The CUDA toolkit is optional and
# not installed here: with /usr/local/cuda present the CUDA backend is built too.
set -euo pipefail
pkgs=(
  build-essential cmake pkg-config file
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libssl-dev openssl prometheus-cpp-dev libabsl-dev libgtest-dev libgmock-dev libopenblas-dev libbenchmark-dev libcli11-dev
  python3 python3-pip python3-grpcio python3-h2 python3-numpy python3-protobuf python3-pytest python3-yaml
  prometheus
  haproxy  # tests/proxy: the replica-routing proxy of deploy/proxy, in front of three servers
  golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
  protoc-gen-go protoc-gen-go-grpc  # the Go client (client/go/build.sh), offline
  python3-venv  # the pip-installed Python client (scripts/python_package.sh)
  clang libclang-rt-14-dev  # the fuzzers (scripts/fuzz.sh): clang 14 and its libFuzzer
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
