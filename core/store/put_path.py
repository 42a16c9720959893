"""The append path: validate, assign offsets, pack the record into the mapped CommitLog,
then dispatch it (ConsumeQueue unit, LMQ units, key index) — all on the writer thread.

This is the hot path of the whole project, so it is written for CPython: one pass, local
variables, precompiled structs, records packed straight into the mapping, no per-message
objects beyond the result. `put_batch` is in put_batch.py.

Multi-dispatch (docs/protocol.md §10.2): with `enable_multi_dispatch`, a message whose
INNER_MULTI_DISPATCH lists queues gets INNER_MULTI_QUEUE_OFFSET (same order, assigned
before encoding), and after the append one unit per distinct queue: `%LMQ%` names go to the
LMQ index (queue 0) when `enable_lmq` is on, other names to that topic's ConsumeQueue with
the message's own queue id. As in RocketMQ, WAIT is dropped from such messages.
"""

from __future__ import annotations

from time import perf_counter_ns, time_ns

from core.common.codec import FIXED_SIZE
from core.common.message import InnerMessage
from core.common.names import LMQ_PREFIX, validate_lmq, validate_topic
from core.common.properties import MessageConst
from core.common.sysflag import MessageSysFlag
from core.common.taghash import tag_hash
from core.store.commitlog import END_FILE_MIN_BLANK
from core.store.key_index import KEYS_PREFIX, UNIQ_PREFIX
from core.store.lmq_index import LMQ_UNIT
from core.store.results import PutResult, PutStatus
from core.store.speedups import encode_props, plan_lmqs, write_record

_MULTI = MessageConst.INNER_MULTI_DISPATCH
_WAIT = MessageConst.WAIT_STORE_MSG_OK
_TAGS = MessageConst.TAGS
_KEYS = MessageConst.KEYS
_UNIQ = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
# (name, value) -> "name\x01value": the properties text is "\x02".join(map(_PAIR, items)),
# the same text as properties.encode_properties without a Python frame per pair.
_PAIR = "\x01".join
_NO_V6 = ~(MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6)
_KV_COMMIT_BYTES = 1 << 20  # commit the RocksDB batch at least every MiB of CommitLog
_TAG_CODES_MAX = 4096  # bounded caches of tag hashes: tags are client-chosen strings
_MULTI_NAMES_MAX = 4096  # bounded cache of split INNER_MULTI_DISPATCH lists


class _Reject(Exception):
    """Internal: a message failed validation (carries the status and remark)."""

    def __init__(self, status: PutStatus, remark: str) -> None:
        self.status = status
        self.remark = remark


def _props_too_large(size: int, limit: int) -> _Reject:
    """The rejection of encoded properties over the limit (shared by every put path)."""
    return _Reject(PutStatus.PROPERTIES_SIZE_EXCEEDED, f"properties size {size} exceeds {limit}")


class PutPath:
    """Mixin of MessageStore holding put/put_batch (uses the store's attributes)."""

    # ------------------------------------------------------------------ helpers
    def _reject(self, status: PutStatus, remark: str) -> PutResult:
        self._stats.put_errors += 1
        return PutResult(status, remark)

    def _not_available(self) -> PutResult | None:
        """The refusal while the store cannot write; None if a retried RocksDB write now
        succeeds (the put goes on)."""
        if not self._running:
            return self._reject(PutStatus.SERVICE_NOT_AVAILABLE, "store is not running")
        self._commit_kv()  # retry the RocksDB write that failed
        if self._kv_error is not None:
            return self._reject(PutStatus.SERVICE_NOT_AVAILABLE, self._kv_error)
        return None  # recovered: the caller goes on

    def _topic_tail(self, topic: str) -> bytes:
        """TOPICLENGTH + TOPIC bytes of a record (cached per valid topic)."""
        tail = self._tails.get(topic)
        if tail is None:
            err = validate_topic(topic)
            if err is not None:
                raise _Reject(PutStatus.MESSAGE_ILLEGAL, err)
            tb = topic.encode()
            tail = bytes((len(tb),)) + tb
            self._tails[topic] = tail
        return tail

    def _plan_multi(
        self, multi: str, topic: str, qid: int, qoff: int, bump: dict | None,
    ) -> tuple[list[int], list, list]:
        """Offsets for INNER_MULTI_DISPATCH (in name order) and the dispatch targets, one per
        distinct queue: [(lmq name, offset)] and [(ConsumeQueue, offset)]. `bump` holds the
        offsets already taken by earlier messages of the same batch."""
        lmq = self._lmq
        lmq_on = self._lmq_on
        # Lists without duplicates and within the limit, by INNER_MULTI_DISPATCH text: the
        # same lists come back (an MQTT topic maps to the same subscriptions).
        names = self._multi_names.get(multi)
        if names is None:
            names = multi.split(",")
            n = len(names)
            if n > self._cfg.max_lmq_per_message:
                raise _Reject(
                    PutStatus.MESSAGE_ILLEGAL,
                    f"INNER_MULTI_DISPATCH lists {n} queues, limit {self._cfg.max_lmq_per_message}",
                )
            if n == 1 or len(set(names)) == n:
                if len(self._multi_names) >= _MULTI_NAMES_MAX:
                    self._multi_names.clear()
                self._multi_names[multi] = names
        elif lmq_on:
            # The usual case: every name a known LMQ (cached names are valid ones), none
            # twice, none the message's own topic. Same result as the loop below.
            planned = plan_lmqs(names, lmq.cache, topic, bump)
            if planned is not None:
                offsets, lmqs, new = planned
                if new:
                    if bump is not None:
                        # LMQs created by earlier messages of the batch are not counted yet.
                        new = bump[None] = bump.get(None, 0) + new
                    if lmq.count + new > self._cfg.max_lmq_consume_queue_num:
                        raise _Reject(
                            PutStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED,
                            f"LMQ count would exceed {self._cfg.max_lmq_consume_queue_num}",
                        )
                return offsets, lmqs, []
        cached = lmq.cache.get
        offsets: list[int] = []
        lmqs: list[tuple[str, int]] = []
        cqs: list = []
        # Duplicate names are rare: pay for the bookkeeping only when there are some.
        firsts: dict[str, int] | None = (
            {} if len(names) > 1 and len(set(names)) < len(names) else None
        )
        new = 0
        for name in names:
            if firsts is not None:
                off = firsts.get(name)
                if off is not None:
                    offsets.append(off)  # same queue twice: one unit, one offset
                    continue
            if name == topic:
                off = qoff  # the message's own queue: no second unit
            elif lmq_on and name.startswith(LMQ_PREFIX):
                off = cached(name)  # a cached name is a valid one
                if off is None:
                    off = lmq.next_offset_checked(name)
                    if off < 0:
                        raise _Reject(PutStatus.LMQ_NAME_ILLEGAL, validate_lmq(name) or name)
                if bump is not None:
                    extra = bump.get(name, 0)
                    bump[name] = extra + 1
                    off += extra
                if off == 0:
                    new += 1
                lmqs.append((name, off))
            else:
                if name not in self._tails and validate_topic(name) is not None:
                    raise _Reject(PutStatus.LMQ_NAME_ILLEGAL, f"illegal dispatch queue name {name!r}")
                cq = self._cq(name, qid)
                off = cq.max_offset
                if bump is not None:
                    extra = bump.get(cq, 0)
                    bump[cq] = extra + 1
                    off += extra
                cqs.append((cq, off))
            offsets.append(off)
            if firsts is not None:
                firsts[name] = off
        if new and bump is not None:
            # LMQs created by earlier messages of the batch are not counted yet.
            bump[None] = bump.get(None, 0) + new
            new = bump[None]
        if new and lmq.count + new > self._cfg.max_lmq_consume_queue_num:
            raise _Reject(
                PutStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED,
                f"LMQ count would exceed {self._cfg.max_lmq_consume_queue_num}",
            )
        return offsets, lmqs, cqs

    def _encode_props(self, props: dict, tags_code, topic: str, qid: int, qoff: int, bump):
        """(properties bytes, tag code, multi offsets, dispatch targets) of one message."""
        offsets = targets = None
        if props:
            multi = props.get(_MULTI) if self._multi_on else None
            if multi:
                offsets, lmqs, cqs = self._plan_multi(multi, topic, qid, qoff, bump)
                targets = (lmqs, cqs)
            pb = encode_props(props, offsets)
            if len(pb) > self._max_props:
                raise _props_too_large(len(pb), self._max_props)
            if tags_code is None:
                tags = props.get(_TAGS)
                # a cached code, else hashed (and cached); 0 is only ever recomputed
                tags_code = (self._tag_codes.get(tags) or self._tag_code(tags)) if tags else 0
        else:
            pb = b""
            if tags_code is None:
                tags_code = 0
        return pb, tags_code, offsets, targets

    def _tag_code(self, tags: str) -> int:
        codes = self._tag_codes
        if len(codes) >= _TAG_CODES_MAX:
            codes.clear()
        tc = codes[tags] = tag_hash(tags)
        return tc

    def _tag_code_raw(self, tags: bytes) -> int:
        codes = self._tag_codes_raw
        if len(codes) >= _TAG_CODES_MAX:
            codes.clear()
        tc = codes[tags] = tag_hash(tags.decode())
        return tc

    def _reserve(self, mf, upto: int) -> str | None:
        """Reserve disk blocks of `mf` up to `upto` (see MappedFile.reserve); the reason
        when the disk is full."""
        ratio = self.disk_used_ratio()
        if ratio > self._cfg.disk_full_ratio:
            return f"disk full: {ratio:.1%} used, limit {self._cfg.disk_full_ratio:.0%}"
        if not self._cfg.preallocate_files:
            # Sparse only: nothing to reserve, but the disk check above still runs per step.
            mf.reserved = min(mf.size, max(upto, mf.reserved + self._cfg.commitlog_reserve_step))
            return None
        try:
            mf.reserve(upto, self._cfg.commitlog_reserve_step)
        except OSError as exc:
            return f"cannot reserve disk space: {exc}"
        return None

    def _prepare_space(self, sizes: list[int]) -> str | None:
        """Create the files and reserve the blocks a batch of records will need, before
        any is written (a batch is all or nothing)."""
        fs = self._fs
        pos = self._wpos
        spans = []  # (file index after the current one, local end)
        k = 0
        for total in sizes:
            if pos + total + END_FILE_MIN_BLANK > fs:
                spans.append((k, pos))
                k += 1
                pos = 0
            pos += total
        spans.append((k, pos))
        try:
            self._prepare_files(k)
        except OSError as exc:
            return f"cannot create CommitLog file: {exc}"
        start = self._cur.start
        for i, end in spans:
            mf = self.commitlog.file_for(start + i * fs)
            if end + END_FILE_MIN_BLANK > mf.reserved:
                err = self._reserve(mf, end + END_FILE_MIN_BLANK)
                if err is not None:
                    return err
        return None

    def _check_common(self, body, born) -> None:
        if len(body) > self._max_body:
            raise _Reject(
                PutStatus.MESSAGE_ILLEGAL,
                f"message body size {len(body)} exceeds {self._max_body}",
            )
        if len(born) != 8 or type(born) is not bytes:
            raise _Reject(PutStatus.MESSAGE_ILLEGAL, "born_host must be 8 bytes (IPv4 + port)")

    def _main_queue(self, topic: str, qid: int):
        """(ConsumeQueue or None for an LMQ topic, next queue offset)."""
        if qid < 0 or qid >= self._max_qid:
            raise _Reject(PutStatus.QUEUE_ID_ILLEGAL, f"queue id {qid} out of range")
        if self._lmq_on and topic.startswith(LMQ_PREFIX):
            if qid != 0:
                raise _Reject(PutStatus.QUEUE_ID_ILLEGAL, "an LMQ has only queue 0")
            err = self._lmq.check_name(topic)
            if err is not None:
                raise _Reject(PutStatus.LMQ_NAME_ILLEGAL, err)
            off = self._lmq.next_offset(topic)
            if off == 0 and self._lmq.count >= self._cfg.max_lmq_consume_queue_num:
                raise _Reject(PutStatus.LMQ_CONSUME_QUEUE_NUM_EXCEEDED, "too many LMQs")
            return None, off
        cq = self._cq(topic, qid)
        return cq, cq.max_offset

    def _index(self, props: dict, topic: str, store_ms: int, phys: int, size: int) -> None:
        keys = props.get(_KEYS)
        if keys:
            for key in keys.split(" "):
                if key:
                    self._keys.add(KEYS_PREFIX, topic, key, store_ms, phys, size)
        uniq = props.get(_UNIQ)
        if uniq:
            self._keys.add(UNIQ_PREFIX, topic, uniq, store_ms, phys, size)

    def _notify_lmqs(self, names: list[str], max_offsets) -> None:
        """Wake the readers of the LMQs `names` a put dispatched to (new max offsets in
        `max_offsets`): one call of lmq_dispatch_listener for all of them when it is set
        (the broker wakes each waiter in one pass), else dispatch_listener per LMQ."""
        many = self.lmq_dispatch_listener
        if many is not None:
            many(names, max_offsets)
            return
        listener = self.dispatch_listener
        if listener is not None:
            for name in names:
                listener(name, 0, max_offsets[name])

    def _dispatch_multi(self, targets: tuple, phys: int, total: int, tc: int, store_ms: int) -> None:
        lmqs, cqs = targets
        listener = self.dispatch_listener
        if lmqs:
            lmq = self._lmq
            lmq.add_planned(lmqs, LMQ_UNIT.pack(phys, total, tc, store_ms))
            self._stats.lmq_dispatches += len(lmqs)
            self._notify_lmqs([name for name, _ in lmqs], lmq.cache)
        for cq, off in cqs:
            cq.append(phys, total, tc)
            if listener is not None:
                listener(cq.topic, cq.queue_id, off + 1)

    # ------------------------------------------------------------------ put
    def put(self, msg: InnerMessage) -> PutResult:
        """Append one message and dispatch it. Bad input returns a non-OK status and
        writes nothing."""
        t0 = perf_counter_ns()
        if not self._running or self._kv_error is not None:
            refused = self._not_available()
            if refused is not None:
                return refused
        topic = msg.topic
        qid = msg.queue_id
        body = msg.body
        blen = len(body)
        tail = self._tails.get(topic)
        # A loaded ConsumeQueue implies a valid topic and queue id: skip their checks.
        cq = self._cqs.get((topic, qid)) if tail is not None else None
        props = msg.properties
        try:
            if tail is None:
                tail = self._topic_tail(topic)
            born = msg.born_host
            if blen > self._max_body or len(born) != 8 or type(born) is not bytes:
                self._check_common(body, born)
            if type(body) is not bytes:
                memoryview(body)  # rejects a body that is not bytes-like
            if cq is None:
                cq, qoff = self._main_queue(topic, qid)
            else:
                qoff = cq.max_offset
            tc = msg.tags_code
            # _encode_props inlined (every put comes here); `names` is set when the
            # message goes to known LMQs only (the gateways' publishes).
            offsets = targets = names = None
            multi = props.get(_MULTI) if props and self._multi_on else None
            if multi:
                names = self._multi_names.get(multi)
                planned = (plan_lmqs(names, self._lmq.cache, topic, None)
                           if names is not None and self._lmq_on else None)
                if planned is not None and not planned[2]:  # (no LMQ created)
                    offsets, lmqs, _ = planned
                else:  # new LMQs, other topics, names not split yet
                    names = None
                    offsets, lmqs, cqs = self._plan_multi(multi, topic, qid, qoff, None)
                    targets = (lmqs, cqs)
            if props:
                pb = encode_props(props, offsets)
                if len(pb) > self._max_props:
                    raise _props_too_large(len(pb), self._max_props)
                if tc is None:
                    tags = props.get(_TAGS)
                    tc = (self._tag_codes.get(tags) or self._tag_code(tags)) if tags else 0
            else:
                pb = b""
                if tc is None:
                    tc = 0
        except _Reject as rej:
            return self._reject(rej.status, rej.remark)
        except (TypeError, ValueError, AttributeError) as exc:  # malformed fields
            return self._reject(PutStatus.MESSAGE_ILLEGAL, f"malformed message: {exc}")
        plen = len(pb)
        tlen = len(tail)
        total = FIXED_SIZE + blen + tlen - 1 + plen
        mf = self._cur
        pos = self._wpos
        if pos + total + END_FILE_MIN_BLANK > self._fs:
            if total + END_FILE_MIN_BLANK > self._fs:
                return self._reject(PutStatus.MESSAGE_ILLEGAL, "record larger than a CommitLog file")
            try:
                mf = self._roll()
            except OSError as exc:
                return self._reject(PutStatus.SERVICE_NOT_AVAILABLE, f"cannot create CommitLog file: {exc}")
            pos = 0
        if pos + total + END_FILE_MIN_BLANK > mf.reserved:
            err = self._reserve(mf, pos + total + END_FILE_MIN_BLANK)
            if err is not None:
                return self._reject(PutStatus.SERVICE_NOT_AVAILABLE, err)
        phys = mf.start + pos
        store_ms = time_ns() // 1_000_000
        write_record(
            mf.mm, pos, total, qid, msg.flag, qoff, phys, msg.sys_flag & _NO_V6,
            msg.born_timestamp, born, store_ms, self._host, msg.reconsume_times,
            msg.prepared_transaction_offset, body, tail, pb,
        )
        end = phys + total
        self._wpos = pos + total
        listener = self.dispatch_listener
        # Dispatch: the message's own queue, then the multi-dispatch queues.
        if cq is not None:
            cq.append(phys, total, tc)
            if listener is not None:
                listener(topic, qid, qoff + 1)
        else:
            self._lmq.add(topic, qoff, LMQ_UNIT.pack(phys, total, tc, store_ms))
            if listener is not None:
                listener(topic, 0, qoff + 1)
        st = self._stats
        if names is not None:  # _dispatch_multi inlined: known LMQs (`names`, in order)
            lmq = self._lmq
            lmq.add_planned(lmqs, LMQ_UNIT.pack(phys, total, tc, store_ms))
            st.lmq_dispatches += len(lmqs)
            many = self.lmq_dispatch_listener
            if many is not None:
                many(names, lmq.cache)
            else:
                self._notify_lmqs(names, lmq.cache)
        elif targets:
            self._dispatch_multi(targets, phys, total, tc, store_ms)
        if self._index_on and props and (_UNIQ in props or _KEYS in props):
            uniq = props.get(_UNIQ)
            if uniq and _KEYS not in props:
                self._keys.add(UNIQ_PREFIX, topic, uniq, store_ms, phys, total)
            else:
                self._index(props, topic, store_ms, phys, total)
        self._wrote = end
        self._last_store_ms = store_ms
        kv = self._kv
        if len(kv.pending) + kv.staged_ops >= self._kv_max_ops or end - kv.marker > _KV_COMMIT_BYTES:
            self._commit_kv()
        st.put_calls += 1
        st.put_msgs += 1
        st.put_bytes += total
        ns = perf_counter_ns() - t0
        b = ns.bit_length()  # stats.bucket_of, inlined
        st.put_latency.counts[(b << 2) | ((ns >> (b - 3)) & 3) if b > 3 else ns] += 1
        return PutResult(
            PutStatus.OK, None, phys, total, qoff, [f"{self._host_hex}{phys:016X}"],
            store_ms, end, offsets if offsets is not None else [],
        )
