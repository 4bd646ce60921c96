#!/usr/bin/env bash
# Regenerates the Go code for every .proto under proto/. Run via `make proto`.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(find proto -name '*.proto' | sort)
protoc -I proto \
  --go_out=proto --go_opt=paths=source_relative \
  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
  "${files[@]}"
