"""The batch append path of MessageStore (a mixin over PutPath): `put_batch`.

A batch is all or nothing: pass 1 validates every message, plans its offsets and encodes
its properties; pass 2 reserves the space, packs the records and dispatches them. A batch
send arrives either as a list of InnerMessage or, from the broker, as a `MessageBatch`: the
send body as the producer encoded it (docs/protocol.md §7.7). The latter costs no object per
message: sub-messages are read straight out of the body, and their property strings are
stored as Java stores them (own string minus WAIT, then the batch-level properties), with
single values (TAGS, KEYS, UNIQ_KEY) read out of the bytes — except for a sub-message with
INNER_MULTI_DISPATCH, whose offsets must be written into it (it goes through a dict).
"""

from __future__ import annotations

import zlib
from time import perf_counter_ns, time_ns

from core.common.codec import BATCH_HEAD, FIXED_SIZE, HEADER, INT16, MAGIC_V1
from core.common.message import InnerMessage, MessageBatch
from core.common.properties import (
    MessageConst,
    decode_properties,
    drop_property,
    find_property,
)
from core.store.commitlog import END_FILE_MIN_BLANK
from core.store.key_index import KEYS_PREFIX, UNIQ_PREFIX
from core.store.lmq_index import LMQ_UNIT
from core.store.put_path import (
    _KEYS,
    _KV_COMMIT_BYTES,
    _MULTI,
    _NO_V6,
    _PAIR,
    _TAGS,
    _UNIQ,
    _WAIT,
    PutPath,
    _Reject,
)
from core.store.results import PutResult, PutStatus
from core.store.speedups import plan_batch_lmqs, split_batch, write_batch

# Markers (name + \x01) for reading encoded property strings, and their lengths.
_M_WAIT = _WAIT.encode() + b"\x01"
_M_TAGS = _TAGS.encode() + b"\x01"
_M_KEYS = _KEYS.encode() + b"\x01"
_M_UNIQ = _UNIQ.encode() + b"\x01"
_M_MULTI = _MULTI.encode() + b"\x01"
_L_WAIT = len(_M_WAIT)
_L_TAGS = len(_M_TAGS)
_L_UNIQ = len(_M_UNIQ)
_SUB_HEAD = BATCH_HEAD.size  # 20
_OFFSETS_PAIR = ("\x02" + MessageConst.INNER_MULTI_QUEUE_OFFSET + "\x01").encode()
_COPY_BYTES = 256 << 10  # records are packed and copied into the mapping by this much at most


def _bad_batch(reason: str) -> _Reject:
    # Same remark as the broker gave when it split batches itself.
    return _Reject(PutStatus.MESSAGE_ILLEGAL, f"bad batch body: {reason}")


class BatchPutPath(PutPath):
    """Mixin of MessageStore adding put_batch to PutPath (uses the store's attributes)."""

    def put_batch(self, msgs: list[InnerMessage] | MessageBatch) -> PutResult:
        """Append messages of one topic and queue with consecutive queue offsets (a batch
        send): a list of InnerMessage, or a MessageBatch (the encoded batch body). All are
        validated first: one bad message rejects the batch, nothing written."""
        t0 = perf_counter_ns()
        if not self._running or self._kv_error is not None:
            refused = self._not_available()
            if refused is not None:
                return refused
        try:
            if type(msgs) is MessageBatch:
                if split_batch is not None:
                    native = self._plan_native(msgs)
                    if native is not None:
                        return self._put_native(msgs, native, t0)
                topic, qid, plan, tail, cq, qoff = self._plan_encoded(msgs)
                host_fields = (msgs.sys_flag & _NO_V6, msgs.born_timestamp, msgs.born_host,
                               msgs.reconsume_times)
            else:
                topic, qid, plan, tail, cq, qoff = self._plan_list(msgs)
                host_fields = None
        except _Reject as rej:
            return self._reject(rej.status, rej.remark)
        except (TypeError, ValueError, AttributeError) as exc:  # malformed fields
            return self._reject(PutStatus.MESSAGE_ILLEGAL, f"malformed message: {exc}")
        err = self._prepare_space([item[4] for item in plan])
        if err is not None:
            return self._reject(PutStatus.SERVICE_NOT_AVAILABLE, err)
        # Pass 2: pack the records, then write them into the mapping with one copy per file
        # (a slice assignment into an mmap costs more than packing: 5 per record before),
        # and dispatch.
        fs = self._fs
        mf = self._cur
        base = mf.start
        pos = start = self._wpos
        host = self._host
        store_ms = time_ns() // 1_000_000
        pack_header = HEADER.pack
        pack16 = INT16.pack
        hexhost = self._host_hex
        parts: list = []
        add = parts.append
        ids = []
        add_id = ids.append
        first_phys = -1
        wrote = 0
        qoff0 = qoff
        lmq_units: list[tuple[str, int, bytes]] = []
        pack_unit = LMQ_UNIT.pack
        index_on = self._index_on
        if index_on:
            entries: list[tuple[bytes, bytes, int, int]] = []
            add_entry = entries.append
            tk = tail[1:] + b"#"  # topic#key: the key index's per-topic prefix
        if host_fields is not None:
            sys_flag, born_ts, born, reconsume = host_fields
        for item in plan:
            src, pb, tc, targets, total, _offsets, crc, key_list, uniq = item
            if pos + total + END_FILE_MIN_BLANK > fs:
                mf.mm[start:pos] = b"".join(parts)
                parts.clear()
                self._wpos = pos
                mf = self._roll()
                base = mf.start
                pos = start = 0
            phys = base + pos
            if host_fields is None:
                body = src.body
                add(pack_header(
                    total, MAGIC_V1, crc, qid, src.flag, qoff, phys,
                    src.sys_flag & _NO_V6, src.born_timestamp, src.born_host, store_ms, host,
                    src.reconsume_times, src.prepared_transaction_offset, len(body),
                ))
            else:
                flag, body = src
                add(pack_header(
                    total, MAGIC_V1, crc, qid, flag, qoff, phys, sys_flag, born_ts,
                    born, store_ms, host, reconsume, 0, len(body),
                ))
            add(body)
            add(tail)
            add(pack16(len(pb)))
            add(pb)
            pos += total
            wrote += total
            if pos - start > _COPY_BYTES:
                mf.mm[start:pos] = b"".join(parts)
                parts.clear()
                start = pos
            unit = None
            if cq is not None:
                cq.append(phys, total, tc)
            else:
                unit = pack_unit(phys, total, tc, store_ms)
                lmq_units.append((topic, qoff, unit))
            if targets:
                lmqs, cqs = targets
                if lmqs:
                    if unit is None:
                        unit = pack_unit(phys, total, tc, store_ms)
                    for name, off in lmqs:
                        lmq_units.append((name, off, unit))
                for tcq, _off in cqs:
                    tcq.append(phys, total, tc)
            if index_on:
                if key_list:
                    for key in key_list:
                        add_entry((KEYS_PREFIX, tk + key, phys, total))
                if uniq:
                    add_entry((UNIQ_PREFIX, tk + uniq, phys, total))
            if first_phys < 0:
                first_phys = phys
            add_id(f"{hexhost}{phys:016X}")
            qoff += 1
        mf.mm[start:pos] = b"".join(parts)
        self._wpos = pos
        if index_on and entries:
            self._keys.add_many(store_ms, entries)
        if lmq_units:
            self._lmq.add_planned_many(lmq_units)
            self._stats.lmq_dispatches += len(lmq_units)
        end = base + pos
        self._wrote = end
        self._last_store_ms = store_ms
        listener = self.dispatch_listener
        if listener is not None:
            listener(topic, qid if cq is not None else 0, qoff)
        self._wake_targets([plan_item[3] for plan_item in plan])
        kv = self._kv
        if len(kv.pending) + kv.staged_ops >= self._kv_max_ops or end - kv.marker > _KV_COMMIT_BYTES:
            self._commit_kv()
        st = self._stats
        st.put_calls += 1
        st.put_msgs += len(plan)
        st.put_bytes += wrote
        st.put_latency.record(perf_counter_ns() - t0)
        first_offsets = plan[0][5]
        return PutResult(
            PutStatus.OK, None, first_phys, wrote, qoff0, ids, store_ms, end,
            first_offsets if first_offsets is not None else [],
        )

    # ------------------------------------------------------------------ native batch
    # A MessageBatch for a topic with a ConsumeQueue, when core._speedups is built: both
    # passes run in C (speedups.split_batch / write_batch), the same checks and bytes as
    # _plan_encoded + the loop of put_batch; sub-messages with INNER_MULTI_DISPATCH get
    # their offsets in _plan_dicts. A sub-message with non-ASCII properties, or a
    # batch-level INNER_MULTI_DISPATCH, sends the whole batch to the Python path.

    def _batch_head(self, batch: MessageBatch) -> tuple:
        """The checks and batch-level values both MessageBatch planners start from:
        (body bytes, topic tail, ConsumeQueue or None, first queue offset, batch-level
        properties text, tag code, KEYS list, UNIQ_KEY, INNER_MULTI_DISPATCH). Batch-level
        values win over a sub-message's own (Java: they come later)."""
        born = batch.born_host
        if len(born) != 8 or type(born) is not bytes:
            raise _Reject(PutStatus.MESSAGE_ILLEGAL, "born_host must be 8 bytes (IPv4 + port)")
        body = batch.body
        if type(body) is not bytes:
            body = batch.body = bytes(body)
        if not body:
            raise _Reject(PutStatus.MESSAGE_ILLEGAL, "empty batch")
        topic = batch.topic
        tail = self._tails.get(topic) or self._topic_tail(topic)
        cq, qoff = self._main_queue(topic, batch.queue_id)
        extra_text = batch.properties or ""
        x_tc = x_keys = x_uniq = x_multi = None
        if extra_text:
            xprops = decode_properties(extra_text)
            x_tags = xprops.get(_TAGS)
            if x_tags:
                x_tc = self._tag_codes.get(x_tags) or self._tag_code(x_tags)
            x_keys, x_uniq = _index_keys(xprops)
            if self._multi_on:
                x_multi = xprops.get(_MULTI)
        return body, tail, cq, qoff, extra_text, x_tc, x_keys, x_uniq, x_multi

    def _plan_native(self, batch: MessageBatch):
        """(items, tail, ConsumeQueue, first queue offset, batch KEYS, batch UNIQ_KEY,
        multi-dispatch plan of _plan_dicts), or None for the Python path. Raises _Reject
        like _plan_encoded."""
        body, tail, cq, qoff, extra_text, x_tc, x_keys, x_uniq, x_multi = self._batch_head(batch)
        if cq is None or x_multi:
            return None  # an LMQ topic (units go to the LMQ index), or batch-level dispatch
        index_on = self._index_on
        items = split_batch(
            body, extra_text.encode(), FIXED_SIZE + len(tail) - 1, self._fs - END_FILE_MIN_BLANK,
            self._max_body, self._max_props, x_tc, index_on and x_keys is None,
            index_on and x_uniq is None, self._multi_on,
        )
        if items is None:
            return None
        if type(items) is tuple:
            status, remark, before = items
            self._plan_dicts(before, batch.topic, batch.queue_id, qoff, len(tail))
            raise _Reject(PutStatus[status], remark)
        multi = None
        if self._multi_on:
            multi = self._plan_batch_lmqs(items, batch.topic, len(tail))
            if multi is None:
                multi = self._plan_dicts(items, batch.topic, batch.queue_id, qoff, len(tail))
        return items, tail, cq, qoff, x_keys, x_uniq, multi

    def _plan_batch_lmqs(self, items: list, topic: str, tlen: int):
        """The usual multi-dispatch of a batch (every item's LMQs known, see
        speedups.plan_batch_lmqs) planned in one C call: ("c", names, bases, first offsets),
        or None for _plan_dicts (without the extension, or any other case)."""
        if plan_batch_lmqs is None or not self._lmq_on:
            return None
        planned = plan_batch_lmqs(
            items, self._multi_names, self._lmq.cache, topic, FIXED_SIZE + tlen - 1,
            self._fs - END_FILE_MIN_BLANK, self._max_props,
        )
        if planned is None:
            return None
        if len(planned) == 2:
            raise _Reject(PutStatus[planned[0]], planned[1])
        return ("c", *planned)

    def _plan_dicts(self, items: list, topic: str, qid: int, qoff: int, tlen: int):
        """Items flagged by split_batch (their properties mention INNER_MULTI_DISPATCH) get
        the dict path of _plan_encoded: properties re-encoded with the multi-dispatch
        offsets, then the size checks. Returns [(item index, offsets, targets)] or None."""
        out = None
        bump: dict = {}
        fixed = FIXED_SIZE + tlen - 1
        limit = self._fs - END_FILE_MIN_BLANK
        max_props = self._max_props
        for i, item in enumerate(items):
            how = item[9]
            if not how:
                continue
            tc = item[4]
            if how is True:
                props = decode_properties(item[3].decode())
                pb, tc, offsets, targets = self._encode_props(props, tc, topic, qid, qoff + i, bump)
            else:
                # Canonical properties (split_batch checked): the dict path would give the
                # same bytes, so only the offsets pair is appended.
                offsets, lmqs, cqs = self._plan_multi(how, topic, qid, qoff + i, bump)
                targets = (lmqs, cqs)
                text = str(offsets[0]) if len(offsets) == 1 else ",".join(map(str, offsets))
                pb = b"".join((item[3], _OFFSETS_PAIR, text.encode()))
                if len(pb) > max_props:
                    raise _Reject(
                        PutStatus.PROPERTIES_SIZE_EXCEEDED,
                        f"properties size {len(pb)} exceeds {self._max_props}",
                    )
            total = fixed + item[2] + len(pb)
            if total > limit:
                raise _Reject(PutStatus.MESSAGE_ILLEGAL, "record larger than a CommitLog file")
            items[i] = (item[0], item[1], item[2], pb, tc, total, item[6], item[7], item[8], False)
            if out is None:
                out = []
            out.append((i, offsets, targets))
        return out

    def _put_native(self, batch: MessageBatch, native: tuple, t0: int) -> PutResult:
        items, tail, cq, qoff, x_keys, x_uniq, multi = native
        err = self._prepare_space([item[5] for item in items])
        if err is not None:
            return self._reject(PutStatus.SERVICE_NOT_AVAILABLE, err)
        store_ms = time_ns() // 1_000_000
        ids: list[str] = []
        units = bytearray()
        index_on = self._index_on
        pending = self._kv.pending if index_on else None
        bucket = store_ms // self._keys.bucket_ms if index_on else 0
        topic_hash = tail[1:] + b"#"
        limit = self._fs - END_FILE_MIN_BLANK
        sys_flag = batch.sys_flag & _NO_V6
        qid = batch.queue_id
        mf = self._cur
        pos = start = self._wpos
        wrote = 0
        i = 0
        n = len(items)
        while True:
            i, pos = write_batch(
                mf.mm, pos, limit, items, i, qid, qoff, mf.start, sys_flag,
                batch.born_timestamp, batch.born_host, store_ms, self._host,
                batch.reconsume_times, batch.body, tail, self._host_hex, ids, units, pending,
                topic_hash, bucket, x_keys, x_uniq,
            )
            wrote += pos - start
            self._wpos = pos
            if i == n:
                break
            mf = self._roll()
            pos = start = 0
        cq.append_packed(units)
        end = mf.start + pos
        self._wrote = end
        self._last_store_ms = store_ms
        listener = self.dispatch_listener
        if listener is not None:
            listener(batch.topic, qid, qoff + n)
        first_offsets = None
        if multi is not None:
            if type(multi) is tuple:  # planned in C
                first_offsets = self._stage_batch_lmqs(multi, units, store_ms)
            else:
                first_offsets = self._dispatch_native(multi, items, ids, store_ms)
        kv = self._kv
        if len(kv.pending) + kv.staged_ops >= self._kv_max_ops or end - kv.marker > _KV_COMMIT_BYTES:
            self._commit_kv()
        st = self._stats
        st.put_calls += 1
        st.put_msgs += n
        st.put_bytes += wrote
        st.put_latency.record(perf_counter_ns() - t0)
        return PutResult(
            PutStatus.OK, None, int(ids[0][-16:], 16), wrote, qoff, ids, store_ms, end,
            first_offsets if first_offsets is not None else [],
        )

    def _wake_targets(self, plan_targets: list) -> None:
        """The wake-ups of a batch's multi-dispatch (one per queue, at its final max
        offset): the LMQs in one _notify_lmqs call, other queues per queue. `plan_targets`
        holds each message's (lmqs, cqs) targets or None."""
        listener = self.dispatch_listener
        if listener is None and self.lmq_dispatch_listener is None:
            return
        lmqs: dict[str, int] = {}
        cqs: dict[tuple[str, int], int] = {}
        for targets in plan_targets:
            if targets:
                for name, off in targets[0]:
                    lmqs[name] = off + 1
                for tcq, off in targets[1]:
                    cqs[(tcq.topic, tcq.queue_id)] = off + 1
        if lmqs:
            self._notify_lmqs(lmqs, lmqs)
        if listener is not None:
            for (name, q), mx in cqs.items():
                listener(name, q, mx)

    def _stage_batch_lmqs(self, multi: tuple, units: bytearray, store_ms: int):
        """_dispatch_native for a batch planned by _plan_batch_lmqs: LMQ units staged in
        one C call, one wake-up per LMQ; returns the first record's offsets (or None)."""
        _, names, bases, first = multi
        lmq = self._lmq
        self._stats.lmq_dispatches += lmq.add_batch(names, bases, units, store_ms)
        self._notify_lmqs(bases, lmq.cache)  # one wake-up per LMQ, at its final offset
        return first

    def _dispatch_native(self, multi: list, items: list, ids: list[str], store_ms: int):
        """Multi-dispatch units of a native batch (LMQ units staged, other queues appended,
        one wake-up per queue); returns the first record's offsets (None if it had none)."""
        lmq_units: list[tuple[str, int, bytes]] = []
        pack_unit = LMQ_UNIT.pack
        for i, _offsets, targets in multi:
            if not targets:
                continue
            lmqs, cqs = targets
            item = items[i]
            phys = int(ids[i][-16:], 16)
            total = item[5]
            tc = item[4]
            if lmqs:
                unit = pack_unit(phys, total, tc, store_ms)
                for name, off in lmqs:
                    lmq_units.append((name, off, unit))
            for tcq, _off in cqs:
                tcq.append(phys, total, tc)
        if lmq_units:
            self._lmq.add_planned_many(lmq_units)
            self._stats.lmq_dispatches += len(lmq_units)
        self._wake_targets([targets for _i, _offsets, targets in multi])
        return multi[0][1] if multi[0][0] == 0 else None

    # ------------------------------------------------------------------ batch pass 1
    # Both planners return (topic, queue id, plan, topic tail, ConsumeQueue or None, first
    # queue offset); a plan item is (source, properties bytes, tag code, dispatch targets,
    # record size, multi offsets, body CRC, [KEYS as bytes] or None, UNIQ_KEY bytes or None)
    # where source is the InnerMessage or (flag, body) of a sub-message of a MessageBatch.

    def _plan_list(self, msgs: list[InnerMessage]):
        if not msgs:
            raise _Reject(PutStatus.MESSAGE_ILLEGAL, "empty batch")
        topic = msgs[0].topic
        qid = msgs[0].queue_id
        fs = self._fs
        max_body = self._max_body
        bump: dict = {}
        plan = []
        add_plan = plan.append
        encode = self._encode_props
        crc32 = zlib.crc32
        tail = self._tails.get(topic) or self._topic_tail(topic)
        cq, qoff = self._main_queue(topic, qid)
        qoff0 = qoff
        fixed = FIXED_SIZE + len(tail) - 1
        index_on = self._index_on
        multi_on = self._multi_on
        max_props = self._max_props
        tag_codes = self._tag_codes
        for msg in msgs:
            if msg.topic != topic or msg.queue_id != qid:
                raise _Reject(PutStatus.MESSAGE_ILLEGAL, "a batch must target one topic and queue")
            body = msg.body
            born = msg.born_host
            if len(body) > max_body or len(born) != 8 or type(born) is not bytes:
                self._check_common(body, born)
            crc = crc32(body) & 0x7FFFFFFF
            props = msg.properties
            tc = msg.tags_code
            key_list = uniq = None
            if props and (not multi_on or _MULTI not in props):
                # As in put(): _encode_props without multi-dispatch, inlined.
                offsets = targets = None
                pb = "\x02".join(map(_PAIR, props.items())).encode()
                if len(pb) > max_props:
                    raise _Reject(
                        PutStatus.PROPERTIES_SIZE_EXCEEDED,
                        f"properties size {len(pb)} exceeds {max_props}",
                    )
                if tc is None:
                    tags = props.get(_TAGS)
                    if tags:
                        tc = tag_codes.get(tags)
                        if tc is None:
                            tc = self._tag_code(tags)
                    else:
                        tc = 0
                if index_on:
                    uniq = props.get(_UNIQ)
                    if uniq:
                        uniq = uniq.encode()
                    if _KEYS in props:
                        key_list = _index_keys(props)[0]
            else:
                pb, tc, offsets, targets = encode(props, tc, topic, qid, qoff, bump)
                if index_on and props:
                    key_list, uniq = _index_keys(props)
            total = fixed + len(body) + len(pb)
            if total + END_FILE_MIN_BLANK > fs:
                raise _Reject(PutStatus.MESSAGE_ILLEGAL, "record larger than a CommitLog file")
            add_plan((msg, pb, tc, targets, total, offsets, crc, key_list, uniq))
            qoff += 1
        return topic, qid, plan, tail, cq, qoff0

    def _plan_encoded(self, batch: MessageBatch):
        """Split, validate and plan a MessageBatch. Property strings stay encoded: single
        values are read out of them (TAGS, KEYS, UNIQ_KEY); only a sub-message with
        INNER_MULTI_DISPATCH goes through a dict (its offsets are written into it)."""
        topic = batch.topic
        qid = batch.queue_id
        body, tail, cq, qoff, extra_text, x_tc, x_keys, x_uniq, x_multi = self._batch_head(batch)
        n = len(body)
        qoff0 = qoff
        fixed = FIXED_SIZE + len(tail) - 1
        fs = self._fs
        max_body = self._max_body
        max_props = self._max_props
        index_on = self._index_on
        multi_on = self._multi_on
        extra = extra_text.encode()
        tag_codes = self._tag_codes_raw
        unpack_head = BATCH_HEAD.unpack_from
        unpack16 = INT16.unpack_from
        crc32 = zlib.crc32
        mv = memoryview(body)
        bump: dict = {}
        plan = []
        add_plan = plan.append
        pos = 0
        while pos < n:
            if pos + _SUB_HEAD > n:
                raise _bad_batch("truncated batch sub-message header")
            size, _magic, _crc, flag, blen = unpack_head(body, pos)
            b0 = pos + _SUB_HEAD
            end = pos + size
            if blen < 0 or size < _SUB_HEAD + 2 + blen or end > n:
                raise _bad_batch("bad batch sub-message size")
            p0 = b0 + blen
            plen = unpack16(body, p0)[0]
            p0 += 2
            if plen < 0 or p0 + plen != end:
                raise _bad_batch("bad batch sub-message properties length")
            if blen > max_body:
                raise _Reject(PutStatus.MESSAGE_ILLEGAL, f"message body size {blen} exceeds {max_body}")
            own = body[p0:end]
            if not own.isascii():
                # As the broker's decode did: invalid UTF-8 is replaced, not stored.
                own = own.decode("utf-8", "replace").encode()
            # The common cases inline (one WAIT pair, one TAGS pair...); the helpers in
            # core.common.properties handle every other string the same way decode does.
            i = own.find(_M_WAIT)
            if i >= 0:
                if i == 0 or own[i - 1] == 2:
                    k = own.find(b"\x02", i + _L_WAIT)
                    own = own[:i] + own[k + 1 :] if k >= 0 else own[:i]
                    if own.find(_M_WAIT, i) >= 0:
                        own = drop_property(own, _M_WAIT)
                else:
                    own = drop_property(own, _M_WAIT)
            if own and extra and own[-1] != 2:
                own += b"\x02"
            if multi_on and (x_multi or own.find(_M_MULTI) >= 0):
                props = decode_properties((own + extra).decode())
                pb, tc, offsets, targets = self._encode_props(props, None, topic, qid, qoff, bump)
                key_list, uniq = _index_keys(props) if index_on else (None, None)
            else:
                pb = own + extra
                if len(pb) > max_props:
                    raise _Reject(
                        PutStatus.PROPERTIES_SIZE_EXCEEDED,
                        f"properties size {len(pb)} exceeds {max_props}",
                    )
                offsets = targets = None
                if x_tc is not None:
                    tc = x_tc
                else:
                    tc = 0
                    i = own.rfind(_M_TAGS)
                    if i >= 0:
                        tags = None
                        if i == 0 or own[i - 1] == 2:
                            k = own.find(b"\x02", i + _L_TAGS)
                            tags = own[i + _L_TAGS : k] if k >= 0 else own[i + _L_TAGS :]
                        if not tags:
                            tags = find_property(own, _M_TAGS)
                        if tags:
                            tc = tag_codes.get(tags)
                            if tc is None:
                                tc = self._tag_code_raw(tags)
                key_list = uniq = None
                if index_on:
                    if x_keys is not None:
                        key_list = x_keys
                    elif own.find(_M_KEYS) >= 0:
                        raw_keys = find_property(own, _M_KEYS)
                        key_list = [k for k in raw_keys.split(b" ") if k] if raw_keys else None
                    if x_uniq is not None:
                        uniq = x_uniq
                    else:
                        i = own.rfind(_M_UNIQ)
                        if i >= 0:
                            if i == 0 or own[i - 1] == 2:
                                k = own.find(b"\x02", i + _L_UNIQ)
                                uniq = own[i + _L_UNIQ : k] if k >= 0 else own[i + _L_UNIQ :]
                            if not uniq:
                                uniq = find_property(own, _M_UNIQ)
            total = fixed + blen + len(pb)
            if total + END_FILE_MIN_BLANK > fs:
                raise _Reject(PutStatus.MESSAGE_ILLEGAL, "record larger than a CommitLog file")
            # Small bodies are copied once (cheaper than a memoryview), large ones viewed.
            sub = body[b0 : p0 - 2] if blen < 4096 else mv[b0 : p0 - 2]
            crc = crc32(sub) & 0x7FFFFFFF
            add_plan(((flag, sub), pb, tc, targets, total, offsets, crc, key_list, uniq))
            qoff += 1
            pos = end
        return topic, qid, plan, tail, cq, qoff0


def _index_keys(props: dict) -> tuple[list[bytes] | None, bytes | None]:
    """KEYS (split) and UNIQ_KEY of a properties dict, UTF-8 encoded, for the key index."""
    keys = props.get(_KEYS)
    uniq = props.get(_UNIQ)
    key_list = [k.encode() for k in keys.split(" ") if k] if keys else None
    return key_list, uniq.encode() if uniq else None
