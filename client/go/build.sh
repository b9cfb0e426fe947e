#!/usr/bin/env bash
# Builds the Go client offline from Debian's packages (golang-go, golang-google-grpc-dev,
# golang-google-protobuf-dev, protoc-gen-go, protoc-gen-go-grpc): generates package fuseboxv1
# from proto/, then vets, tests and builds the client and its example in GOPATH mode against
# /usr/share/gocode (Debian's Go sources; nothing is downloaded or vendored).
#   client/go/build.sh OUT_DIR    -> OUT_DIR/fusebox-go-example
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
gopath=$out/gopath
pkg=$gopath/src/fusebox/client/go
rm -rf "$pkg"
mkdir -p "$pkg"
cp -r "$root/client/go/fusebox" "$root/client/go/example" "$pkg/"
# go_package in the proto puts the generated files at fusebox/client/go/fuseboxv1.
protoc --proto_path="$root/proto" --go_out="$gopath/src" --go-grpc_out="$gopath/src" \
  "$root/proto/fusebox/v1/kernel_service.proto"
export GO111MODULE=off GOPROXY=off GOFLAGS= GOPATH="$gopath:/usr/share/gocode" \
  GOCACHE="$out/gocache"
cd "$pkg"
go vet ./fusebox ./example
go test ./fusebox
go build -o "$out/fusebox-go-example" ./example
echo "built $out/fusebox-go-example"
