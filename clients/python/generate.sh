#!/usr/bin/env bash
# Regenerates src/meridian_client/client_pb2.py and client_pb2.pyi from proto/client.proto.
#
# The generator is grpcio-tools' bundled protoc, pinned in pyproject.toml's `dev` extra, so
# every machine produces the same bytes (the system protoc would vary with the distribution).
# The output is committed: `pip install ./clients/python` then needs no protoc at all.
# tests/test_generated.py fails when the committed module differs from a fresh generation.
#
# Usage: clients/python/generate.sh [PYTHON]   (default: the python on PATH, which must have
# the dev extra installed: pip install './clients/python[dev]')
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto_dir="$(cd "$here/../../proto" && pwd)"
python="${1:-python}"
out="$here/src/meridian_client"
"$python" -m grpc_tools.protoc -I "$proto_dir" --python_out="$out" --pyi_out="$out" "$proto_dir/client.proto"
echo "generated $out/client_pb2.py and client_pb2.pyi with $("$python" -m grpc_tools.protoc --version)"
