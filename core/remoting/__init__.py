"""RocketMQ remoting: sans-IO frame codec, trio server and client, in-process transport.

Public surface::

    from core.remoting import (RemotingCommand, RequestCode, ResponseCode, ProcessorTable,
                               RequestContext, RemotingServer, RemotingClient, Connection)
"""

from core.remoting.client import RemotingClient, parse_addr
from core.remoting.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
    RemotingCommand,
    decode_frame,
    encode_command,
    encode_command_bytes,
)
from core.remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_NAMES,
    SERVER_VERSION,
    LanguageCode,
    MQVersion,
    RequestCode,
    ResponseCode,
)
from core.remoting.connection import Connection, ConnectionLimits, TcpConnection
from core.remoting.errors import (
    FrameError,
    HeaderError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from core.remoting.local import LocalConnection
from core.remoting.processor import Handler, ProcessorTable, RequestContext
from core.remoting.server import RemotingServer

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "LANGUAGE_NAMES",
    "SERVER_VERSION",
    "Connection",
    "ConnectionLimits",
    "FrameDecoder",
    "FrameError",
    "Handler",
    "HeaderError",
    "LanguageCode",
    "LocalConnection",
    "MQVersion",
    "ProcessorTable",
    "RemotingClient",
    "RemotingCommand",
    "RemotingConnectError",
    "RemotingError",
    "RemotingServer",
    "RemotingTimeoutError",
    "RequestCode",
    "RequestContext",
    "ResponseCode",
    "TcpConnection",
    "decode_frame",
    "encode_command",
    "encode_command_bytes",
    "parse_addr",
]
