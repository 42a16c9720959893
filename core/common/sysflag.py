"""Flag words of the RocketMQ protocol (docs/protocol.md §5.2, §7.3, §9.5)."""

from __future__ import annotations


class MessageSysFlag:
    """Bits of a stored message's SYSFLAG field (docs/protocol.md §7.3)."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED_TYPE = 0x4
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
    TRANSACTION_MASK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80
    COMPRESSION_TYPE_MASK = 0x700

    @staticmethod
    def transaction_value(sys_flag: int) -> int:
        return sys_flag & MessageSysFlag.TRANSACTION_MASK

    @staticmethod
    def reset_transaction_value(sys_flag: int, value: int) -> int:
        return (sys_flag & ~MessageSysFlag.TRANSACTION_MASK) | value


class PullSysFlag:
    """Bits of PULL_MESSAGE's `sysFlag` (docs/protocol.md §5.2)."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL = 0x10


class PermName:
    """Topic and broker permission bits (docs/protocol.md §9.5)."""

    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8
    READ_WRITE = READ | WRITE

    @staticmethod
    def is_readable(perm: int) -> bool:
        return bool(perm & PermName.READ)

    @staticmethod
    def is_writeable(perm: int) -> bool:
        return bool(perm & PermName.WRITE)

    @staticmethod
    def is_inherited(perm: int) -> bool:
        return bool(perm & PermName.INHERIT)


class TopicSysFlag:
    UNIT = 0x1
    UNIT_SUB = 0x2
