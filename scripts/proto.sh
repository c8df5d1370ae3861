#!/usr/bin/env bash
# Regenerates proto/llmgw/v1's Go code with Debian's protoc and the pinned
# protoc-gen-go / protoc-gen-go-grpc (installed into $(go env GOPATH)/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
bin="$(go env GOPATH)/bin"
want_go="protoc-gen-go ${PROTOC_GEN_GO_VERSION}"
if [ ! -x "$bin/protoc-gen-go" ] || ! "$bin/protoc-gen-go" --version 2>/dev/null | grep -q "${PROTOC_GEN_GO_VERSION}"; then
  go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
fi
if [ ! -x "$bin/protoc-gen-go-grpc" ] || ! "$bin/protoc-gen-go-grpc" --version 2>/dev/null | grep -q "${PROTOC_GEN_GO_GRPC_VERSION#v}"; then
  go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
fi
command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
PATH="$bin:$PATH" protoc -I proto \
  --go_out=proto --go_opt=paths=source_relative \
  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
  proto/llmgw/v1/*.proto
