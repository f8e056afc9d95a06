"""The peer service between comparator replicas (``protos/extproc/shadow/v1``).

Handlers are registered by name from the proto's descriptor, with the generated
message classes, rather than through the untyped generated ``shadow_pb2_grpc``
helpers, so the calls stay type-checked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import grpc

from extproc.tools.shadow.v1 import shadow_pb2 as pb

SERVICE: Final = pb.DESCRIPTOR.services_by_name["ShadowPeer"].full_name
FORWARD_PATH: Final = f"/{SERVICE}/Forward"
GET_TALLY_PATH: Final = f"/{SERVICE}/GetTally"

Context = grpc.aio.ServicerContext[object, object]
ForwardHandler = Callable[[pb.ForwardRequest, Context], Awaitable[pb.ForwardReply]]
TallyHandler = Callable[[pb.GetTallyRequest, Context], Awaitable[pb.GetTallyReply]]


def peer_handler(forward: ForwardHandler, get_tally: TallyHandler) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Forward": grpc.unary_unary_rpc_method_handler(
                forward,
                request_deserializer=pb.ForwardRequest.FromString,
                response_serializer=pb.ForwardReply.SerializeToString,
            ),
            "GetTally": grpc.unary_unary_rpc_method_handler(
                get_tally,
                request_deserializer=pb.GetTallyRequest.FromString,
                response_serializer=pb.GetTallyReply.SerializeToString,
            ),
        },
    )


class PeerClient:
    """Calls one peer replica; one HTTP/2 channel, reused."""

    def __init__(self, address: str, *, max_message_bytes: int) -> None:
        self.address = address
        self.channel = grpc.aio.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes),
            ],
        )
        self._forward = self.channel.unary_unary(
            FORWARD_PATH,
            request_serializer=pb.ForwardRequest.SerializeToString,
            response_deserializer=pb.ForwardReply.FromString,
        )
        self._get_tally = self.channel.unary_unary(
            GET_TALLY_PATH,
            request_serializer=pb.GetTallyRequest.SerializeToString,
            response_deserializer=pb.GetTallyReply.FromString,
        )

    async def forward(self, request: pb.ForwardRequest, timeout_s: float) -> pb.ForwardReply:
        reply: pb.ForwardReply = await self._forward(request, timeout=timeout_s)
        return reply

    async def get_tally(self, timeout_s: float) -> pb.GetTallyReply:
        reply: pb.GetTallyReply = await self._get_tally(pb.GetTallyRequest(), timeout=timeout_s)
        return reply

    async def close(self) -> None:
        await self.channel.close()
