"""A gateway in miniature for the cluster tier: drives an endpoint picker (EPP) through Envoy's ext-proc protocol
(envoy.service.ext_proc.v3.ExternalProcessor/Process, one bidirectional gRPC stream per HTTP request) as a GIE
Gateway's ext-proc filter does, then forwards the request to the endpoint the EPP picked and streams the answer back
through the EPP, so the EPP sees a request's whole life (its prefix index, running-request counts and flow control
depend on it). No Envoy exists here; this is the part of it the EPP talks to.

The ext-proc messages are built from the FileDescriptorSet that .ci/epp.sh writes from the Go packages the EPP is
built with (epp/cmd/extproc-descriptors), so the client speaks exactly the protocol version of the EPP it drives,
with no generated stubs to keep: grpcio carries the stream, protobuf's descriptor pool builds the messages.
"""

from __future__ import annotations

import json
import queue
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import grpc
import requests
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

PACKAGE = "envoy.service.ext_proc.v3"
METHOD = f"/{PACKAGE}.ExternalProcessor/Process"
DESTINATION_HEADER = "x-gateway-destination-endpoint"  # where the EPP names the endpoint (and in envoy.lb metadata)


@dataclass(frozen=True)
class Routed:
    """One request's fate: the EPP's immediate answer (status, no endpoint), or the endpoint it picked and what that
    endpoint answered."""

    status: int
    endpoint: str | None = None  # "<pod IP>:<port>"
    body: dict[str, Any] = field(default_factory=dict)
    detail: str = ""  # an immediate response's body (the EPP's reason)


class ExtProcError(AssertionError):
    pass


class Protocol:
    """The ext-proc message classes, from the descriptor set."""

    def __init__(self, descriptors: Path) -> None:
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptors.read_bytes())
        self.pool = descriptor_pool.DescriptorPool()
        for file in files.file:  # dependencies first, as the Go side writes them
            self.pool.Add(file)

    def message(self, name: str) -> type[Message]:
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(name))

    @cached_property
    def request(self) -> type[Message]:
        return self.message(f"{PACKAGE}.ProcessingRequest")

    @cached_property
    def response(self) -> type[Message]:
        return self.message(f"{PACKAGE}.ProcessingResponse")


class Gateway:
    """Routes OpenAI-style requests through an EPP listening on `address` (TLS, trusting `ca`: the EPP serves with the
    certificate given by --cert-path) and on to the engine stand-ins it picks."""

    def __init__(self, address: str, descriptors: Path, ca: Path) -> None:
        self.protocol = Protocol(descriptors)
        self.channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca.read_bytes()))
        self.process = self.channel.stream_stream(
            METHOD,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=self.protocol.response.FromString,
        )

    def close(self) -> None:
        self.channel.close()

    def route(self, body: dict[str, Any], path: str = "/v1/chat/completions", timeout: float = 60.0) -> Routed:
        """One HTTP request through the EPP and, when it picks an endpoint, to that endpoint and back."""
        outgoing: queue.Queue[Message | None] = queue.Queue()
        stream = self.process(iter(outgoing.get, None), timeout=timeout)
        try:
            return self._exchange(outgoing, stream, body, path)
        finally:
            outgoing.put(None)  # half-close: the EPP's stream ends as Envoy's does after the response
            stream.cancel()

    def _exchange(
        self, outgoing: queue.Queue[Message | None], stream: Iterator[Message], body: dict[str, Any], path: str
    ) -> Routed:
        request = self.protocol.request
        encoded = json.dumps(body).encode()
        headers = {
            ":method": "POST",
            ":path": path,
            ":authority": "gateway.test",
            "content-type": "application/json",
            "content-length": str(len(encoded)),
            "x-request-id": str(uuid.uuid4()),
        }
        outgoing.put(request(request_headers={"headers": header_map(headers), "end_of_stream": False}))
        outgoing.put(request(request_body={"body": encoded, "end_of_stream": True}))

        answer = next_response(stream)
        if answer.WhichOneof("response") == "immediate_response":
            immediate = answer.immediate_response
            return Routed(status=immediate.status.code, detail=immediate.body.decode(errors="replace"))
        if answer.WhichOneof("response") != "request_headers":
            raise ExtProcError(f"expected the request headers' answer first, got {answer}")
        set_headers = {
            h.header.key: h.header.raw_value.decode()
            for h in answer.request_headers.response.header_mutation.set_headers
        }
        endpoint = set_headers.get(DESTINATION_HEADER)
        if not endpoint:
            raise ExtProcError(f"the EPP answered without {DESTINATION_HEADER}: {answer}")
        forwarded = b""
        while True:  # the (possibly rewritten) body, streamed back in chunks
            chunk = next_response(stream)
            streamed = chunk.request_body.response.body_mutation.streamed_response
            forwarded += streamed.body
            if streamed.end_of_stream:
                break

        upstream = requests.post(
            f"http://{endpoint}{path}", data=forwarded, headers={"content-type": "application/json"}, timeout=30
        )
        response_headers = {":status": str(upstream.status_code), "content-type": "application/json"}
        outgoing.put(request(response_headers={"headers": header_map(response_headers), "end_of_stream": False}))
        outgoing.put(request(response_body={"body": upstream.content, "end_of_stream": True}))
        next_response(stream)  # the response headers' answer
        while not next_response(stream).response_body.response.body_mutation.streamed_response.end_of_stream:
            pass
        return Routed(status=upstream.status_code, endpoint=endpoint, body=upstream.json())


def header_map(headers: dict[str, str]) -> dict[str, Any]:
    """An HttpHeaders.headers (config.core.v3.HeaderMap) as Envoy sends it: values in raw_value."""
    return {"headers": [{"key": key, "raw_value": value.encode()} for key, value in headers.items()]}


def next_response(stream: Iterator[Message]) -> Message:
    try:
        return next(stream)
    except StopIteration:
        raise ExtProcError("the EPP closed the ext-proc stream early") from None
