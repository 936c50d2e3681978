"""Generates toolfleet_client/_generated from proto/toolfleet/v1/agent.proto
(two directories up, in the toolfleet checkout) before the package is built.
Everything else is in pyproject.toml."""

import pathlib
import re

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
PROTO_DIR = HERE.parent.parent / "proto" / "toolfleet" / "v1"
OUT = HERE / "toolfleet_client" / "_generated"


def generate() -> None:
    from grpc_tools import protoc  # a build requirement (pyproject.toml)

    proto = PROTO_DIR / "agent.proto"
    if not proto.is_file():
        raise SystemExit(
            f"{proto} not found: build the client from a toolfleet checkout "
            "(pip install ./clients/python)"
        )
    OUT.mkdir(exist_ok=True)
    (OUT / "__init__.py").write_text('"""Generated from proto/toolfleet/v1/agent.proto."""\n')
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={OUT}",
            f"--pyi_out={OUT}",
            f"--grpc_python_out={OUT}",
            str(proto),
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed on {proto} ({code})")
    # protoc writes `import agent_pb2`; inside a package it must be relative.
    stub = OUT / "agent_pb2_grpc.py"
    stub.write_text(
        re.sub(r"^import agent_pb2", "from . import agent_pb2", stub.read_text(), flags=re.M)
    )


# Before setup(): the package list names the generated package.
generate()
setup()
