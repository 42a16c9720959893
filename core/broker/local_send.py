"""Storing messages in process (docs/store-api.md "In process"), beside the send request
codes: a gateway running in the broker's process (`lmq serve`) stores its publishes
through `LocalSend` with no request, no header strings and no response to parse.

It runs the send processor's own checks and put (`SendProcessor.store`,
core/broker/processors/send.py), so both keep the same rules: the broker's and the
topic's write permission, topic names, auto-creation, the message size limit,
INNER_MULTI_DISPATCH rights, batch body validation, and a SYNC_FLUSH or SYNC_MASTER put
returning once flushed / replicated. What the request layer adds before the processor is
done here too: the ACL rights of the gateway's account when the broker does not trust
in-process peers (`PlainAclGuard.trust_in_process`). A refusal raises the MQBrokerError a
request would have been answered with (same code, same remark).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core.acl.permissions import send_resource
from core.client.errors import MQBrokerError
from core.remoting.codec import SERVER_VERSION
from core.remoting.codes import ResponseCode
from core.store.results import PutResult, PutStatus

from .pop.handoff import deferring
from .processors import send
from .processors.send import SendHeader, SendProcessor, SendRefused

__all__ = ["LOCAL_REMOTE", "LocalSend", "LocalSent"]

log = logging.getLogger(__name__)

#: The born host of messages stored in process (over the in-process transport a peer
#: has a pseudo address too).
LOCAL_REMOTE = "127.0.0.1:0"
_SUCCESS = ResponseCode.SUCCESS


@dataclass(slots=True)
class LocalSent:
    """What a send response carries: `code` is SUCCESS or a code of a stored message
    (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE); `result` has the
    offset msgIds (one per message), the queue offset and the LMQ offsets."""

    code: int
    queue_id: int
    result: PutResult


class LocalSend:
    """SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE of one broker without requests (module doc)."""

    def __init__(self, broker, access_key: str | None = None) -> None:
        self.broker = broker
        self.access_key = access_key
        self._processor = SendProcessor(broker)
        #: Sends served, for tests and metrics.
        self.sends = 0

    @classmethod
    def of(cls, broker, access_key: str | None = None) -> LocalSend | None:
        """The in-process API of `broker` for a gateway signing with `access_key`, or None
        when the broker runs in apache_strict mode (it serves Apache's codes only)."""
        if broker is None or broker.config.apache_strict:
            return None
        return cls(broker, access_key)

    def _may_inner(self, guard, topic: str) -> bool:
        """ACL as the request's guard when it does not trust in-process peers: raises its
        refusal; whether INNER_* may be set."""
        refused = guard.in_process_refusal(self.access_key, [send_resource(topic)])
        if refused is not None:
            raise self._refused(ResponseCode.SYSTEM_ERROR, refused)
        principal = guard.principal(self.access_key)
        return principal is not None and principal.may_write_inner

    async def send(self, header: SendHeader, body: bytes) -> LocalSent:
        """Store one message (`header.batch` False: `body` is its payload) or a batch
        (`body` a batch body, docs/protocol.md §7.7) as the send request would; the
        answer, or MQBrokerError with the code the request would be answered with."""
        guard = self.broker.table.guard
        if guard is None or getattr(guard, "trust_in_process", True):
            may_inner = True  # an in-process peer: IN_PROCESS (core/acl/validator.py)
        else:
            may_inner = self._may_inner(guard, header.topic)
        self.sends += 1
        try:
            result, queue_id = await deferring(self.broker, self._processor.store(
                header, body, LOCAL_REMOTE, may_inner, SERVER_VERSION))  # (pop/handoff.py)
        except SendRefused as refused:
            raise self._refused(refused.code, refused.remark) from None
        except Exception as exc:  # as the processor table answers a failing handler
            log.error("in-process send failed (answered SYSTEM_ERROR)", exc_info=exc)
            raise self._refused(ResponseCode.SYSTEM_ERROR,
                                str(exc) or type(exc).__name__) from None
        if result.status is PutStatus.OK:
            return LocalSent(_SUCCESS, queue_id, result)
        code = send.put_code(result)
        if code and code not in send.STORED_CODES:
            raise self._refused(code, send.put_failure(result))
        return LocalSent(code, queue_id, result)

    def _refused(self, code: int, remark: str) -> MQBrokerError:
        return MQBrokerError(code, remark, self.broker.broker_addr)
