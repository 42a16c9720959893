"""Native Python client for RocketMQ 4.x brokers (ours or Apache's): producers, push /
pull / poll / LMQ consumers and administration, on trio; `core.client.blocking` wraps it
for plain scripts. See docs/client.md.
"""

from core.client.admin import AdminClient
from core.client.allocate import allocate_averagely, allocate_averagely_by_circle
from core.client.config import ClientConfig
from core.client.errors import ClientStateError, MQBrokerError, MQClientError, NoRouteError
from core.client.instance import ClientInstance
from core.client.lite_pull import LitePullConsumer
from core.client.lmq_consumer import LmqConsumer
from core.client.model import (
    ConsumeFromWhere,
    ExpressionType,
    MessageModel,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from core.client.pop_consumer import PopClient, PopMessage, PopResult
from core.client.producer import Producer, SendFuture, select_by_hash
from core.client.pull_consumer import PullConsumer
from core.client.push_consumer import ConsumeContext, ConsumeStatus, PushConsumer
from core.client.transaction import (
    LocalTransactionState,
    TransactionProducer,
    TransactionSendResult,
)
from core.common.message import Message, MessageExt

__all__ = [
    "AdminClient",
    "ClientConfig",
    "ClientInstance",
    "ClientStateError",
    "ConsumeContext",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "ExpressionType",
    "LitePullConsumer",
    "LmqConsumer",
    "LocalTransactionState",
    "MQBrokerError",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "NoRouteError",
    "PopClient",
    "PopMessage",
    "PopResult",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "SendFuture",
    "SendResult",
    "SendStatus",
    "TransactionProducer",
    "TransactionSendResult",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "select_by_hash",
]
