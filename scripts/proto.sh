#!/usr/bin/env bash
# Regenerates proto/llmgw/v1's Go code with Debian's protoc and the pinned
# protoc-gen-go / protoc-gen-go-grpc (installed into $(go env GOPATH)/bin).
#
# --check (make protocheck): fail when regenerating would change proto/.
# The files of proto/ as they are now, uncommitted edits included, are
# snapshotted into a throwaway git index; the code is regenerated in place and
# `git diff` against that snapshot (plus any new untracked file) tells
# staleness. When stale, the diff is printed and proto/ is put back from the
# snapshot: a failing check leaves the tree as it found it.
set -euo pipefail
cd "$(dirname "$0")/.."
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
bin="$(go env GOPATH)/bin"

generate() {
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
}

case "${1:-}" in
"")
  generate
  ;;
--check)
  snap="$(mktemp -d)/index"
  trap 'rm -rf "$(dirname "$snap")"' EXIT
  GIT_INDEX_FILE="$snap" git add -A -- proto
  generate
  changed="$(GIT_INDEX_FILE="$snap" git diff --name-only -- proto)"
  added="$(GIT_INDEX_FILE="$snap" git ls-files --others --exclude-standard -- proto)"
  if [ -n "$changed$added" ]; then
    GIT_INDEX_FILE="$snap" git --no-pager diff --stat -- proto
    GIT_INDEX_FILE="$snap" git --no-pager diff -- proto | head -40
    [ -z "$added" ] || printf 'new file: %s\n' $added
    # Put proto/ back as it was: changed files from the snapshot, new ones removed.
    [ -z "$changed" ] || GIT_INDEX_FILE="$snap" git checkout -q -- $changed
    [ -z "$added" ] || rm -f -- $added
    echo "generated code in proto/ is stale: run make proto and commit" >&2
    exit 1
  fi
  ;;
*)
  echo "usage: $0 [--check]" >&2
  exit 2
  ;;
esac
