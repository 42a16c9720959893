"""The broker's Apache-only strict mode (`apache_strict`, docs/stateless-gateways.md §5).

With it on, every request code that Apache RocketMQ 5 does not have is refused with
REQUEST_CODE_NOT_SUPPORTED and a remark naming the code, so tests run against a strict
broker prove that a client (the gateways above all) would also run in front of Apache.

`APACHE_5_CODES` is the one table of allowed codes: the codes of `RequestCode` whose name
and number Apache's RequestCode.java has in every 5.x release (docs/stateless-gateways.md
docs/protocol.md §4 lists them with the release that has each). Codes outside it that our broker serves
(the private 900000 range of docs/pop.md, anything added later) are refused; a code no
processor serves is refused by the table's default handler as before.
"""

from __future__ import annotations

from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.processor import ProcessorTable, RequestContext

__all__ = ["APACHE_5_CODES", "restrict"]

# Everything in RequestCode except our private codes (the 900000-900999 range: POP holders,
# dead-letter, purge, the HA controller). BATCH_ACK_MESSAGE appeared in Apache 5.1.3; all
# others are in 5.0.0.
_PRIVATE = frozenset(c for c in RequestCode if 900000 <= c <= 900999)
APACHE_5_CODES: frozenset[int] = frozenset(int(c) for c in RequestCode if c not in _PRIVATE)


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return "unknown"


async def _refuse(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        f"request code {cmd.code} ({_code_name(cmd.code)}) not supported in apache_strict mode",
    )


def restrict(table: ProcessorTable, allowed: frozenset[int] = APACHE_5_CODES) -> list[int]:
    """Refuse every code registered in `table` that is not in `allowed`; return them."""
    refused = [code for code in table.codes() if code not in allowed]
    for code in refused:
        table.register(code, _refuse, inline=True)
    return refused
