"""Regenerate messaging_pb2.py / messaging_pb2_grpc.py from messaging.proto.

    pip install grpcio-tools && python3 -m gateway.grpc5.proto.generate

The generated modules are committed (a fresh clone needs no protoc); run this after
editing the .proto and commit the result. The generated code names the protobuf and
grpcio versions it needs at run time: keep pyproject.toml's lower bounds at or above them.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path


def main() -> int:
    from grpc_tools import protoc

    root = Path(__file__).resolve().parents[3]  # the repository: imports are package paths
    proto = Path(__file__).with_name("messaging.proto").relative_to(root)
    include = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    return protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={root}",
                        f"--grpc_python_out={root}", str(proto)])


if __name__ == "__main__":
    sys.exit(main())
