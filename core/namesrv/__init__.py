"""Name server: broker registry and topic routes (docs/protocol.md §4).

    from core.namesrv import NameServer, NamesrvConfig
"""

from core.namesrv.bodies import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfigData,
    decode_register_body,
    encode_register_body,
)
from core.namesrv.config import NamesrvConfig
from core.namesrv.kvconfig import NAMESPACE_ORDER_TOPIC_CONFIG, KVConfigManager
from core.namesrv.processors import NamesrvProcessors, NamesrvStats
from core.namesrv.routes import BrokerData, QueueData, RegisterResult, RouteInfoManager
from core.namesrv.server import NameServer

__all__ = [
    "NAMESPACE_ORDER_TOPIC_CONFIG",
    "BrokerData",
    "DataVersion",
    "KVConfigManager",
    "NameServer",
    "NamesrvConfig",
    "NamesrvProcessors",
    "NamesrvStats",
    "QueueData",
    "RegisterBrokerBody",
    "RegisterResult",
    "RouteInfoManager",
    "TopicConfigData",
    "decode_register_body",
    "encode_register_body",
]
