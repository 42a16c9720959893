"""Master/slave replication of a broker (docs/ha.md)."""

from core.broker.ha.controller_link import ControllerLink
from core.broker.ha.service import HAMaster, HASlave, SyncStatus

__all__ = ["ControllerLink", "HAMaster", "HASlave", "SyncStatus"]
