"""Runs the grpcurl session of docs/api.md through this client, so that the
document cannot drift from the API.

    python -m toolfleet_client.api_doc docs/api.md --addr 127.0.0.1:50051

Every `grpcurl` line of the document's `sh` blocks is executed:

- `list` and `describe NAME` through server reflection (v1alpha, as
  grpcio-reflection speaks it);
- `-d BODY ADDRESS toolfleet.v1.AgentService/METHOD` by parsing BODY into the
  method's request message (as grpcurl does) and calling it.

The document's address (127.0.0.1:50051, or 127.0.0.1:PORT) is replaced by `--addr`, and `JOB_ID` by the id of the
last SubmitJob. With TOOLFLEET_TOKEN set (a static token or a JWT), every
call carries `authorization: Bearer <token>`, as grpcurl's
`-H "authorization: Bearer $TOOLFLEET_TOKEN"` would. A line this runner does not understand, an RPC error, a
service missing from `list` or a watch that ends without its final event
fails the run (exit status 1).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import List

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor_pool import DescriptorPool

from ._generated import agent_pb2 as pb
from ._generated import agent_pb2_grpc as pb_grpc

# The documents' placeholders of the server's address.
DOC_ADDRESSES = ("127.0.0.1:50051", "127.0.0.1:PORT")
SERVICE = "toolfleet.v1.AgentService"


def commands(markdown: str) -> List[List[str]]:
    """The grpcurl command lines of the shell blocks (indented ones too),
    split like a shell; a block marked `<!-- not run: why -->` on the line
    before its fence is skipped, as the Rust tests skip it
    (tests/src/markdown.rs)."""
    lines = []
    in_block = skipped = False
    previous = ""
    for line in markdown.splitlines():
        stripped = line.strip()
        if not in_block and stripped.startswith("```"):
            in_block = True
            shell = stripped[3:].strip() in ("sh", "bash", "shell", "console")
            skipped = not shell or previous.startswith("<!-- not run:")
        elif in_block and stripped == "```":
            in_block = False
        elif in_block and not skipped and stripped.startswith("grpcurl "):
            lines.append(shlex.split(stripped))
        previous = stripped
    return lines


class Session:
    def __init__(self, address: str, token: str = ""):
        self.address = address
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.AgentServiceStub(self.channel)
        self.job_id = ""

    def run(self, words: List[str]) -> None:
        args = [w for w in words[1:] if w != "-plaintext"]
        body = None
        if len(args) >= 2 and args[0] == "-d":
            body, args = args[1], args[2:]
        if not args or args[0] not in DOC_ADDRESSES:
            raise SystemExit(f"expected the address {DOC_ADDRESSES[0]} after the flags: {words}")
        verb = args[1:]
        if verb == ["list"] and body is None:
            self.list()
        elif len(verb) == 2 and verb[0] == "describe" and body is None:
            self.describe(verb[1])
        elif len(verb) == 1 and body is not None and verb[0].startswith(SERVICE + "/"):
            self.call(verb[0].split("/", 1)[1], body)
        else:
            raise SystemExit(f"this runner does not know the grpcurl command {words}")

    def reflection(self):
        # Imported here: only the document's runner needs the extra.
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase,
        )

        return ProtoReflectionDescriptorDatabase(self.channel)

    def list(self) -> None:
        services = list(self.reflection().get_services())
        print("\n".join(services))
        if SERVICE not in services:
            raise SystemExit(f"{SERVICE} is not in the reflection list: {services}")

    def describe(self, name: str) -> None:
        pool = DescriptorPool(self.reflection())
        try:
            descriptor = pool.FindServiceByName(name)
            print(f"{name} is a service: {', '.join(m.name for m in descriptor.methods)}")
        except KeyError:
            descriptor = pool.FindMessageTypeByName(name)
            print(f"{name} is a message: {', '.join(f.name for f in descriptor.fields)}")

    def call(self, method_name: str, body: str) -> None:
        method = pb.DESCRIPTOR.services_by_name["AgentService"].methods_by_name[method_name]
        request_type = getattr(pb, method.input_type.name)
        request = json_format.Parse(body.replace("JOB_ID", self.job_id), request_type())
        rpc = getattr(self.stub, method_name)
        if method.server_streaming:
            last = None
            for response in rpc(request, timeout=60, metadata=self.metadata):
                print(json_format.MessageToJson(response, indent=None))
                last = response
            if last is None or not last.final:
                raise SystemExit(f"{method_name} ended without the job's final event")
            return
        response = rpc(request, timeout=30, metadata=self.metadata)
        print(json_format.MessageToJson(response, indent=None))
        if method_name == "SubmitJob":
            self.job_id = response.job_id


def main() -> int:
    parser = argparse.ArgumentParser(description="Run docs/api.md's grpcurl session.")
    parser.add_argument("document", help="the Markdown file, e.g. docs/api.md")
    parser.add_argument("--addr", required=True, help="the orchestrator's gRPC host:port")
    args = parser.parse_args()
    with open(args.document, encoding="utf-8") as file:
        lines = commands(file.read())
    if not lines:
        raise SystemExit(f"{args.document} has no grpcurl lines")
    session = Session(args.addr, os.environ.get("TOOLFLEET_TOKEN", ""))
    for words in lines:
        print(f"$ {shlex.join(words)}")
        try:
            session.run(words)
        except grpc.RpcError as err:
            print(f"failed: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    print(f"ran {len(lines)} grpcurl commands against {args.addr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
