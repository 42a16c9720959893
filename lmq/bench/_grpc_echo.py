"""A bare grpc.aio server answering MessagingService.QueryRoute with a fixed route and
nothing else: the per-call baseline of `lmq bench grpc` (`python -m lmq.bench._grpc_echo PORT`)."""

from __future__ import annotations

import asyncio
import sys

import grpc

from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg


class Echo(pbg.MessagingServiceServicer):
    async def QueryRoute(self, request, context):
        resp = pb.QueryRouteResponse()
        resp.status.code = pb.OK
        for qid in range(4):  # what the front end answers for a 4-queue topic
            mq = resp.message_queues.add(id=qid, permission=pb.READ_WRITE)
            mq.topic.CopyFrom(request.topic)
            mq.broker.name = "broker-a"
            mq.broker.endpoints.scheme = pb.IPv4
            mq.broker.endpoints.addresses.add(host="127.0.0.1", port=8081)
            mq.accept_message_types.extend((pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION))
        return resp


async def main(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pbg.add_MessagingServiceServicer_to_server(Echo(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
