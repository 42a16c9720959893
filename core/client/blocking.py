"""Blocking face of the client for plain (non-trio) programs.

`BlockingClient` runs a `ClientInstance` in a background thread with its own ``trio.run``;
every method of the objects it hands out runs in that thread through
``trio.from_thread`` and blocks the caller until done::

    from core.client.blocking import BlockingClient
    from core.common.message import Message

    with BlockingClient("127.0.0.1:9876") as client:
        with client.producer("PG") as producer:
            print(producer.send(Message("TopicA", b"hello")))

Listeners of push and LMQ consumers are plain functions called in worker threads;
callbacks of `send_async` run on the client thread and must return quickly.
`BlockingClient.shared(addr)` gives the process one client per name-server set (refcounted).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import inspect
import threading
from typing import Any

import trio

from core.client.admin import AdminClient
from core.client.config import ClientConfig, parse_namesrv_addr
from core.client.instance import ClientInstance
from core.client.lite_pull import LitePullConsumer
from core.client.lmq_consumer import LmqConsumer
from core.client.producer import Producer
from core.client.pull_consumer import PullConsumer
from core.client.push_consumer import PushConsumer
from core.client.transaction import TransactionProducer
from core.common.message import Message

_open_clients: set[BlockingClient] = set()
_shared: dict[tuple[str, ...], tuple[BlockingClient, int]] = {}
_shared_lock = threading.Lock()


class BlockingProxy:
    """Wraps an async client object: its methods run in the client thread and block."""

    def __init__(self, client: BlockingClient, target: Any) -> None:
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_target", target)

    @property
    def target(self) -> Any:
        """The wrapped async object (for use inside the client thread only)."""
        return self._target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr) or isinstance(attr, type):
            return attr
        client = self._client
        if inspect.iscoroutinefunction(attr):
            @functools.wraps(attr)
            def run_async(*args: Any, **kwargs: Any) -> Any:
                return client.call(attr, *args, **kwargs)
            return run_async

        @functools.wraps(attr)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            return client.call_sync(attr, *args, **kwargs)
        return run_sync

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __enter__(self) -> BlockingProxy:
        if hasattr(self._target, "start"):
            self._client.call(self._target.start)
        return self

    def __exit__(self, *exc: object) -> None:
        if hasattr(self._target, "shutdown"):
            self._client.call(self._target.shutdown)

    def __repr__(self) -> str:
        return f"<blocking {self._target!r}>"


class BlockingProducer(BlockingProxy):
    """A Producer whose `send_async` returns a concurrent.futures.Future."""

    def send_async(self, msg: Message, callback=None, *, timeout: float | None = None
                   ) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def done(result, error) -> None:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
            if callback is not None:
                callback(result, error)

        self._client.call_sync(self._target.send_async, msg, done, timeout=timeout)
        return future


class BlockingClient:
    """A `ClientInstance` on a background thread; see the module docstring."""

    def __init__(self, namesrv_addr: str | list[str] = "127.0.0.1:9876", **config: Any) -> None:
        self.config = ClientConfig(namesrv_addr=namesrv_addr, **config)
        self.instance: ClientInstance | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._thread_main, name="lmq-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        _open_clients.add(self)

    @classmethod
    def shared(cls, namesrv_addr: str | list[str] = "127.0.0.1:9876", **config: Any) -> BlockingClient:
        """The process's client for this name-server set (created on first use); each
        `shared()` call must be matched by one `close()`."""
        key = tuple(sorted(parse_namesrv_addr(namesrv_addr)))
        with _shared_lock:
            entry = _shared.get(key)
            if entry is not None and not entry[0]._closed:
                _shared[key] = (entry[0], entry[1] + 1)
                return entry[0]
            client = cls(namesrv_addr, **config)
            client._shared_key = key
            _shared[key] = (client, 1)
            return client

    # -- the client thread -----------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()

    async def _main(self) -> None:
        async with ClientInstance(self.config) as instance:
            self.instance = instance
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()

    def call(self, afn, *args: Any, **kwargs: Any) -> Any:
        """Run ``await afn(*args, **kwargs)`` in the client thread and return its result."""
        if self._closed or self._token is None:
            raise RuntimeError("BlockingClient is closed")
        return trio.from_thread.run(functools.partial(afn, *args, **kwargs), trio_token=self._token)

    def call_sync(self, fn, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in the client thread (for trio-touching sync calls)."""
        if self._closed or self._token is None:
            raise RuntimeError("BlockingClient is closed")
        return trio.from_thread.run_sync(functools.partial(fn, *args, **kwargs), trio_token=self._token)

    def close(self) -> None:
        """Shut down producers and consumers cleanly and stop the client thread."""
        key = getattr(self, "_shared_key", None)
        if key is not None:
            with _shared_lock:
                entry = _shared.get(key)
                if entry is not None and entry[0] is self:
                    if entry[1] > 1:
                        _shared[key] = (self, entry[1] - 1)
                        return
                    del _shared[key]
        if self._closed:
            return
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._closed = True
        self._thread.join()
        _open_clients.discard(self)

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- factories ------------------------------------------------------------------

    def _make(self, cls, *args: Any, **kwargs: Any) -> Any:
        assert self.instance is not None
        return self.call_sync(cls, self.instance, *args, **kwargs)

    def producer(self, group: str = "DEFAULT_PRODUCER", **kwargs: Any) -> BlockingProducer:
        """A Producer (not started: use ``with`` or ``.start()``)."""
        return BlockingProducer(self, self._make(Producer, group, **kwargs))

    def transaction_producer(self, group: str, *, execute_local, check, **kwargs: Any) -> BlockingProducer:
        """A TransactionProducer; `execute_local(msg, arg)` and `check(msg)` run on the
        client thread (plain functions) — keep them short or make them async."""
        return BlockingProducer(self, self._make(TransactionProducer, group,
                                                 execute_local=execute_local, check=check, **kwargs))

    def push_consumer(self, group: str, listener, **kwargs: Any) -> BlockingProxy:
        """A PushConsumer; subscribe, then start (``with`` or ``.start()``)."""
        return BlockingProxy(self, self._make(PushConsumer, group, listener, **kwargs))

    def pull_consumer(self, group: str) -> BlockingProxy:
        return BlockingProxy(self, self._make(PullConsumer, group))

    def lite_pull_consumer(self, group: str, **kwargs: Any) -> BlockingProxy:
        return BlockingProxy(self, self._make(LitePullConsumer, group, **kwargs))

    def lmq_consumer(self, group: str, lmq: str, listener=None, **kwargs: Any) -> BlockingProxy:
        return BlockingProxy(self, self._make(LmqConsumer, group, lmq, listener, **kwargs))

    def admin(self) -> BlockingProxy:
        return BlockingProxy(self, self._make(AdminClient))


@atexit.register
def _close_all() -> None:
    # A script that forgets close() still persists its offsets and unregisters.
    for client in list(_open_clients):
        try:
            client._shared_key = None
            client.close()
        except Exception:
            pass
