/* core._speedups: the per-message byte work of the store's put paths, in C.
 *
 * The store (core/store/put_path.py, put_batch.py, lmq_index.py) plans every message in
 * Python -- validation, queue offsets, LMQ offsets, file rolls -- and hands the byte work
 * to these functions: encoding a properties dict, packing a CommitLog record straight into
 * the mapping, staging LMQ units, building the RocksDB keys of staged units, and splitting
 * a batch send body. core/store/speedups_py.py holds the same functions in Python (the
 * reference, and the fallback where this module was not built); tests check that both
 * give the same bytes.
 *
 * Formats: docs/protocol.md §7.1 (record), §7.7 (batch body); kv.py (LMQ unit keys).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ CRC-32 (zlib's) */
static uint32_t crc_tab[8][256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_tab[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_tab[0][c & 0xff] ^ (c >> 8);
            crc_tab[t][i] = c;
        }
    }
}

/* Slice-by-8 over little-endian words (x86-64, aarch64); bytewise elsewhere. */
static uint32_t crc32_buf(const unsigned char *p, Py_ssize_t n)
{
    uint32_t c = 0xFFFFFFFFu;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^
            crc_tab[5][(lo >> 16) & 0xff] ^ crc_tab[4][lo >> 24] ^
            crc_tab[3][hi & 0xff] ^ crc_tab[2][(hi >> 8) & 0xff] ^
            crc_tab[1][(hi >> 16) & 0xff] ^ crc_tab[0][hi >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n-- > 0)
        c = crc_tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* ------------------------------------------------------------------ helpers */
static inline void put_u16(unsigned char *p, uint32_t v) { p[0] = v >> 8; p[1] = v; }
static inline void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}
static inline void put_u64(unsigned char *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}
static inline uint32_t get_u32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Every entry point takes exact types (int, not bool or an object with __index__; bytes,
 * not a subclass; list, dict, tuple, str): converting them runs no Python code, so nothing
 * a caller controls can change a container between a check and its use. Where Python code
 * does run (a put callback, a hostile key's __eq__ during a dict lookup), what is used
 * across it is held by a strong reference and sizes are read again. */
static int as_i64(PyObject *o, long long *out, const char *what)
{
    if (!PyLong_CheckExact(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    long long v = PyLong_AsLongLong(o);  /* OverflowError past int64 */
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static int as_i32(PyObject *o, long long *out, const char *what)
{
    if (as_i64(o, out, what) < 0)
        return -1;
    if (*out < INT32_MIN || *out > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s out of int32 range", what);
        return -1;
    }
    return 0;
}

static PyObject *mmap_type;  /* mmap.mmap */

/* The writable target of a record: an exact bytearray or mmap.mmap (a subclass could
 * override what a Python slice assignment does). A read-only one is a TypeError. */
static int get_target(PyObject *o, Py_buffer *b)
{
    if (!PyByteArray_CheckExact(o) && (PyObject *)Py_TYPE(o) != mmap_type) {
        PyErr_SetString(PyExc_TypeError, "the target must be a bytearray or an mmap");
        return -1;
    }
    if (PyObject_GetBuffer(o, b, PyBUF_WRITABLE) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "the target is not writable");
        }
        return -1;
    }
    return 0;
}

/* Decimal text of v at p (at most 20 bytes); returns its length. */
static Py_ssize_t format_i64(char *p, long long v)
{
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    Py_ssize_t len = 0;
    if (v < 0)
        p[len++] = '-';
    while (n)
        p[len++] = tmp[--n];
    return len;
}

static PyObject *S_WAIT, *S_MULTI_OFFSETS;
static const char OFFSETS_PAIR[] = "\x02INNER_MULTI_QUEUE_OFFSET\x01";
#define OFFSETS_PAIR_LEN (sizeof(OFFSETS_PAIR) - 1)

/* ------------------------------------------------------------------ crc32 */
static PyObject *sp_crc32(PyObject *self, PyObject *arg)
{
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {  /* not contiguous */
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "crc32 needs a contiguous bytes-like object");
        }
        return NULL;
    }
    uint32_t c = crc32_buf(b.buf, b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* ------------------------------------------------------------------ encode_props
 * encode_props(props: dict[str, str], offsets: list[int] | None) -> bytes
 * "\x02".join(k + "\x01" + v for k, v in props.items()) in UTF-8. With offsets: WAIT and
 * INNER_MULTI_QUEUE_OFFSET pairs are left out and "\x02INNER_MULTI_QUEUE_OFFSET\x01" plus
 * the offsets joined by "," is appended. Exact types only (a dict, str names and values, a
 * list of ints in int64): anything else is a TypeError (OverflowError past int64), a lone
 * surrogate a UnicodeEncodeError (as str.encode raises it). Everything is converted (the
 * offsets formatted, every string's UTF-8 taken) before the output is sized; the copy is
 * still checked against that size. */
static int dropped(PyObject *k)
{
    return PyUnicode_Compare(k, S_WAIT) == 0 || PyUnicode_Compare(k, S_MULTI_OFFSETS) == 0;
}

static PyObject *sp_encode_props(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "encode_props(props, offsets)");
        return NULL;
    }
    PyObject *props = args[0], *offsets = args[1];
    if (!PyDict_CheckExact(props)) {
        PyErr_SetString(PyExc_TypeError, "properties must be a dict");
        return NULL;
    }
    int multi = offsets != Py_None;
    if (multi && !PyList_CheckExact(offsets)) {
        PyErr_SetString(PyExc_TypeError, "offsets must be a list");
        return NULL;
    }
    /* The offsets text, formatted once into a small buffer (or the heap past it). */
    char small[512];
    char *otext = small;
    Py_ssize_t olen = 0;
    if (multi) {
        Py_ssize_t noff = PyList_GET_SIZE(offsets);
        if (noff > PY_SSIZE_T_MAX / 21)
            return PyErr_NoMemory();
        if (noff * 21 > (Py_ssize_t)sizeof small) {
            otext = PyMem_Malloc(noff * 21);
            if (!otext)
                return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < noff && i < PyList_GET_SIZE(offsets); i++) {
            long long o;
            if (as_i64(PyList_GET_ITEM(offsets, i), &o, "an offset") < 0) {
                if (otext != small)
                    PyMem_Free(otext);
                return NULL;
            }
            if (i)
                otext[olen++] = ',';
            olen += format_i64(otext + olen, o);
        }
    }
    /* Sizes, and the UTF-8 of every string (cached by CPython in the str). */
    Py_ssize_t pos = 0, total = multi ? (Py_ssize_t)OFFSETS_PAIR_LEN + olen : 0, npairs = 0;
    PyObject *k, *v, *out = NULL;
    while (PyDict_Next(props, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) {
            PyErr_SetString(PyExc_TypeError, "property names and values must be str");
            goto done;
        }
        if (multi && dropped(k))
            continue;
        Py_ssize_t kl, vl;
        if (!PyUnicode_AsUTF8AndSize(k, &kl) || !PyUnicode_AsUTF8AndSize(v, &vl))
            goto done;
        total += kl + vl + 1 + (npairs ? 1 : 0);
        npairs++;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (!out)
        goto done;
    char *w = PyBytes_AS_STRING(out), *end = w + total;
    pos = 0;
    npairs = 0;
    while (PyDict_Next(props, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v) || (multi && dropped(k)))
            continue;
        Py_ssize_t kl, vl;
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kl);
        const char *vs = PyUnicode_AsUTF8AndSize(v, &vl);
        if (!ks || !vs)
            goto changed;
        if (kl + vl + 1 + (npairs ? 1 : 0) > end - w)
            goto changed;
        if (npairs++)
            *w++ = '\x02';
        memcpy(w, ks, kl);
        w += kl;
        *w++ = '\x01';
        memcpy(w, vs, vl);
        w += vl;
    }
    if (multi) {
        if ((Py_ssize_t)OFFSETS_PAIR_LEN + olen != end - w)
            goto changed;
        memcpy(w, OFFSETS_PAIR, OFFSETS_PAIR_LEN);
        memcpy(w + OFFSETS_PAIR_LEN, otext, olen);
    } else if (w != end) {
        goto changed;
    }
    goto done;
changed:  /* unreachable with exact types; never write past the buffer if it happens */
    Py_CLEAR(out);
    PyErr_SetString(PyExc_RuntimeError, "properties changed while being encoded");
done:
    if (otext != small)
        PyMem_Free(otext);
    return out;
}

/* ==== s5-dupc: the header fields write_record and write_batch share ==================== */
/* sys flag, born timestamp, born host, store timestamp, store host and reconsume times:
 * the same for every record of a write_batch call, and taken by both entry points as six
 * arguments in this order (a[0..5]). */
struct rec_common {
    long long sys_flag, born_ts, store_ms, reconsume;
    const char *born, *host;  /* 8 bytes each, held by the caller's arguments */
};

/* The four ints of a[0..5], checked in argument order (the callers chain this between
 * their own checks, so the first bad argument is still the one reported). */
static inline int common_ints(PyObject *const *a, struct rec_common *c)
{
    if (as_i32(a[0], &c->sys_flag, "sys flag") < 0 ||
        as_i64(a[1], &c->born_ts, "born timestamp") < 0 ||
        as_i64(a[3], &c->store_ms, "store timestamp") < 0 ||
        as_i32(a[5], &c->reconsume, "reconsume times") < 0)
        return -1;
    return 0;
}

/* The two hosts of a[0..5]: exact bytes of 8, else ValueError. */
static inline int common_hosts(PyObject *const *a, struct rec_common *c)
{
    PyObject *born = a[2], *host = a[4];
    if (!PyBytes_CheckExact(born) || PyBytes_GET_SIZE(born) != 8 || !PyBytes_CheckExact(host) ||
        PyBytes_GET_SIZE(host) != 8) {
        PyErr_SetString(PyExc_ValueError, "hosts must be 8 bytes");
        return -1;
    }
    c->born = PyBytes_AS_STRING(born);
    c->host = PyBytes_AS_STRING(host);
    return 0;
}
/* ==== end s5-dupc ==== */

/* One v1 record (docs/protocol.md §7.1) at p: header, body, topic tail, properties. */
static void pack_record(unsigned char *p, long long total, uint32_t crc, long long qid,
                        long long flag, long long qoff, long long phys,
                        const struct rec_common *c, long long prep,
                        const void *body, Py_ssize_t blen, const char *tail, Py_ssize_t tlen,
                        const char *pb, Py_ssize_t plen)
{
    put_u32(p, (uint32_t)total);
    put_u32(p + 4, 0xDAA320A7u);
    put_u32(p + 8, crc);
    put_u32(p + 12, (uint32_t)qid);
    put_u32(p + 16, (uint32_t)flag);
    put_u64(p + 20, (uint64_t)qoff);
    put_u64(p + 28, (uint64_t)phys);
    put_u32(p + 36, (uint32_t)c->sys_flag);
    put_u64(p + 40, (uint64_t)c->born_ts);
    memcpy(p + 48, c->born, 8);
    put_u64(p + 56, (uint64_t)c->store_ms);
    memcpy(p + 64, c->host, 8);
    put_u32(p + 72, (uint32_t)c->reconsume);
    put_u64(p + 76, (uint64_t)prep);
    put_u32(p + 84, (uint32_t)blen);
    p += 88;
    memcpy(p, body, blen);
    p += blen;
    memcpy(p, tail, tlen);
    p += tlen;
    put_u16(p, (uint32_t)plen);
    memcpy(p + 2, pb, plen);
}

/* ------------------------------------------------------------------ write_record
 * write_record(mm, pos, total, queue_id, flag, queue_offset, phys, sys_flag, born_ts,
 *              born_host, store_ms, store_host, reconsume, prepared_offset, body, tail, pb)
 * Packs one v1 record (header, body, topic tail, properties length, properties) into `mm`
 * (an exact bytearray or mmap) at `pos`; the body CRC is computed here. `total` must equal
 * the record size. Ints are exact ints (int32 or int64 as the field), hosts, tail and
 * properties exact bytes, the body any C-contiguous buffer. Every argument is checked
 * before a byte is written. */
static PyObject *sp_write_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "write_record takes 17 arguments");
        return NULL;
    }
    long long pos, total, qid, flag, qoff, phys, prep;
    struct rec_common c;
    if (as_i64(args[1], &pos, "pos") < 0 || as_i64(args[2], &total, "total") < 0 ||
        as_i32(args[3], &qid, "queue id") < 0 || as_i32(args[4], &flag, "flag") < 0 ||
        as_i64(args[5], &qoff, "queue offset") < 0 || as_i64(args[6], &phys, "phys") < 0 ||
        common_ints(args + 7, &c) < 0 || as_i64(args[13], &prep, "prepared offset") < 0 ||
        common_hosts(args + 7, &c) < 0)
        return NULL;
    PyObject *tail = args[15], *pb = args[16];
    if (!PyBytes_CheckExact(tail) || !PyBytes_CheckExact(pb)) {
        PyErr_SetString(PyExc_TypeError, "tail and properties must be bytes");
        return NULL;
    }
    Py_ssize_t tlen = PyBytes_GET_SIZE(tail), plen = PyBytes_GET_SIZE(pb);
    if (plen > 32767) {
        PyErr_SetString(PyExc_ValueError, "properties longer than 32767 bytes");
        return NULL;
    }
    Py_buffer body;
    if (PyObject_GetBuffer(args[14], &body, PyBUF_SIMPLE) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "the body must be a contiguous bytes-like object");
        }
        return NULL;
    }
    Py_buffer mm;
    if (get_target(args[0], &mm) < 0) {
        PyBuffer_Release(&body);
        return NULL;
    }
    PyObject *ret = NULL;
    if (body.len > INT32_MAX || total != 88 + body.len + tlen + 2 + plen || total > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "record size does not match its parts");
        goto done;
    }
    if (pos < 0 || pos > mm.len - total) {
        PyErr_SetString(PyExc_ValueError, "record does not fit in the mapping");
        goto done;
    }
    pack_record((unsigned char *)mm.buf + pos, total, crc32_buf(body.buf, body.len) & 0x7FFFFFFFu,
                qid, flag, qoff, phys, &c, prep, body.buf, body.len,
                PyBytes_AS_STRING(tail), tlen, PyBytes_AS_STRING(pb), plen);
    ret = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&mm);
    PyBuffer_Release(&body);
    return ret;
}

/* ------------------------------------------------------------------ plan_lmqs
 * plan_lmqs(names: list[str], cache: dict[str, int], topic: str, bump: dict | None)
 *   -> (offsets: list[int], targets: list[tuple[str, int]], new LMQs: int) | None
 * The usual multi-dispatch plan: every name a cached LMQ (so valid, known to be distinct
 * by the caller) and none the message's own topic; offsets are the cached next offsets,
 * plus, inside a batch, bump[name] (the offsets earlier messages of the batch took; each
 * name's count goes up by one). None when that does not hold (the caller's general loop
 * decides); then bump is untouched. The names are read from a snapshot of the list (a
 * dict lookup can run a hostile key's __eq__); cached and bump values must be ints. */
static PyObject *sp_plan_lmqs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) ||
        !PyUnicode_CheckExact(args[2]) || (args[3] != Py_None && !PyDict_CheckExact(args[3]))) {
        PyErr_SetString(PyExc_TypeError,
                        "plan_lmqs(names: list, cache: dict, topic: str, bump: dict | None)");
        return NULL;
    }
    PyObject *cache = args[1], *bump = args[3];
    PyObject *names = PyList_AsTuple(args[0]);  /* strong: the list may change below */
    if (!names)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *offsets = NULL, *targets = NULL, *ret = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "LMQ names must be str");
            goto done;
        }
    }
    int has = PyDict_Contains(cache, args[2]);
    if (has != 0) {
        ret = has < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {  /* all cached, before bump changes */
        int in = PyDict_Contains(cache, PyTuple_GET_ITEM(names, i));
        if (in <= 0) {
            ret = in < 0 ? NULL : Py_NewRef(Py_None);
            goto done;
        }
    }
    offsets = PyList_New(n);
    targets = offsets ? PyList_New(n) : NULL;
    if (!targets)
        goto done;
    long created = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *cached = PyDict_GetItemWithError(cache, name);
        long long off;
        if (!cached) {  /* removed by a hostile key since it was checked */
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "the LMQ cache changed while planning");
            goto done;
        }
        if (as_i64(cached, &off, "a cached offset") < 0)  /* before any other call */
            goto done;
        if (bump != Py_None) {
            PyObject *b = PyDict_GetItemWithError(bump, name);
            long long extra = 0;
            if (!b && PyErr_Occurred())
                goto done;
            if (b && as_i64(b, &extra, "a bump count") < 0)
                goto done;
            if (extra == INT64_MAX || __builtin_add_overflow(off, extra, &off)) {
                PyErr_SetString(PyExc_OverflowError, "LMQ offset out of int64 range");
                goto done;
            }
            PyObject *nb = PyLong_FromLongLong(extra + 1);
            if (!nb)
                goto done;
            int r = PyDict_SetItem(bump, name, nb);
            Py_DECREF(nb);
            if (r < 0)
                goto done;
        }
        PyObject *o = PyLong_FromLongLong(off);
        if (!o)
            goto done;
        PyObject *t = PyTuple_Pack(2, name, o);
        if (!t) {
            Py_DECREF(o);
            goto done;
        }
        PyList_SET_ITEM(offsets, i, o);
        PyList_SET_ITEM(targets, i, t);
        if (off == 0)
            created++;
    }
    ret = Py_BuildValue("(OOl)", offsets, targets, created);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(targets);
    Py_DECREF(names);
    return ret;
}

/* ------------------------------------------------------------------ stage_units
 * stage_units(staged: dict, cache: dict, targets: list[tuple[str, int]], unit: bytes) -> int
 * LmqIndex.add_planned's loop: append (offset, unit) to staged[name] (a new list
 * [offset, unit] for a queue not staged yet), set cache[name] = offset + 1. Returns how many
 * offsets were 0 (new LMQs). Every target is checked (a (str, int) tuple, offset in
 * [0, 2**63 - 1)) before anything is staged. */
static PyObject *sp_stage_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) ||
        !PyList_CheckExact(args[2]) || !PyBytes_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "stage_units(staged: dict, cache: dict, targets: list, unit: bytes)");
        return NULL;
    }
    PyObject *staged = args[0], *cache = args[1], *unit = args[3];
    PyObject *targets = PyList_AsTuple(args[2]);  /* strong: the list may change below */
    if (!targets)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(targets);
    PyObject *ret = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(targets, i);
        long long o;
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(t, 0))) {
            PyErr_SetString(PyExc_TypeError, "targets must be (name, offset) tuples");
            goto done;
        }
        if (as_i64(PyTuple_GET_ITEM(t, 1), &o, "an LMQ offset") < 0)
            goto done;
        if (o < 0 || o == INT64_MAX) {
            PyErr_SetString(PyExc_ValueError, "LMQ offset out of range");
            goto done;
        }
    }
    long created = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(targets, i);
        PyObject *name = PyTuple_GET_ITEM(t, 0), *off = PyTuple_GET_ITEM(t, 1);
        long long o = PyLong_AsLongLong(off);  /* checked above */
        PyObject *units = PyDict_GetItemWithError(staged, name);
        if (units == NULL) {
            if (PyErr_Occurred())
                goto done;
            units = PyList_New(2);
            if (!units)
                goto done;
            PyList_SET_ITEM(units, 0, Py_NewRef(off));
            PyList_SET_ITEM(units, 1, Py_NewRef(unit));
            int r = PyDict_SetItem(staged, name, units);
            Py_DECREF(units);
            if (r < 0)
                goto done;
        } else {
            if (!PyList_CheckExact(units)) {
                PyErr_SetString(PyExc_TypeError, "staged units must be lists");
                goto done;
            }
            /* no Python code runs between the lookup and these appends */
            if (PyList_Append(units, off) < 0 || PyList_Append(units, unit) < 0)
                goto done;
        }
        if (o == 0)
            created++;
        PyObject *next = PyLong_FromLongLong(o + 1);
        if (!next)
            goto done;
        int r = PyDict_SetItem(cache, name, next);
        Py_DECREF(next);
        if (r < 0)
            goto done;
    }
    ret = PyLong_FromLong(created);
done:
    Py_DECREF(targets);
    return ret;
}

/* ------------------------------------------------------------------ write_units
 * write_units(snapshot: dict[str, list], put, prefixes: dict[str, bytes]) -> int
 * LmqIndex.write_staged: for every queue name in sorted order, each staged (offset, value)
 * pair becomes put(b"u" name b"\x00" int64be(offset), value). `prefixes` caches the
 * b"u" name b"\x00" of each name (the caller bounds it). Returns the number of puts.
 * `put` is Python code that may change any of these containers: the prefix, the units
 * list and the value of each call are held by strong references across it. */
static PyObject *sp_write_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_CheckExact(args[0]) || !PyCallable_Check(args[1]) ||
        !PyDict_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "write_units(snapshot: dict, put, prefixes: dict)");
        return NULL;
    }
    PyObject *snapshot = args[0], *put = args[1], *prefixes = args[2];
    PyObject *names = PyDict_Keys(snapshot);
    if (!names)
        return NULL;
    long count = 0;
    PyObject *prefix = NULL, *units = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        if (!PyUnicode_CheckExact(PyList_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "LMQ names must be str");
            goto fail;
        }
    }
    if (PyList_Sort(names) < 0)  /* str only: no Python code */
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        PyObject *name = PyList_GET_ITEM(names, i);  /* `names` is ours */
        prefix = PyDict_GetItemWithError(prefixes, name);
        Py_XINCREF(prefix);
        if (prefix == NULL) {
            if (PyErr_Occurred())
                goto fail;
            Py_ssize_t nl;
            const char *ns = PyUnicode_AsUTF8AndSize(name, &nl);
            if (!ns)
                goto fail;
            prefix = PyBytes_FromStringAndSize(NULL, nl + 2);
            if (!prefix)
                goto fail;
            char *pp = PyBytes_AS_STRING(prefix);
            pp[0] = 'u';
            memcpy(pp + 1, ns, nl);
            pp[nl + 1] = 0;
            if (PyDict_SetItem(prefixes, name, prefix) < 0)
                goto fail;
        }
        if (!PyBytes_CheckExact(prefix)) {
            PyErr_SetString(PyExc_TypeError, "prefixes must be bytes");
            goto fail;
        }
        Py_ssize_t plen = PyBytes_GET_SIZE(prefix);
        units = PyDict_GetItemWithError(snapshot, name);
        Py_XINCREF(units);
        if (!units || !PyList_CheckExact(units)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "staged units must be lists");
            goto fail;
        }
        for (Py_ssize_t j = 0; j + 1 < PyList_GET_SIZE(units); j += 2) {  /* size re-read */
            long long off;
            if (as_i64(PyList_GET_ITEM(units, j), &off, "a unit offset") < 0)
                goto fail;
            PyObject *key = PyBytes_FromStringAndSize(NULL, plen + 8);
            if (!key)
                goto fail;
            memcpy(PyBytes_AS_STRING(key), PyBytes_AS_STRING(prefix), plen);
            put_u64((unsigned char *)PyBytes_AS_STRING(key) + plen, (uint64_t)off);
            PyObject *value = Py_NewRef(PyList_GET_ITEM(units, j + 1));
            PyObject *callargs[2] = {key, value};
            PyObject *r = PyObject_Vectorcall(put, callargs, 2, NULL);
            Py_DECREF(key);
            Py_DECREF(value);
            if (!r)
                goto fail;
            Py_DECREF(r);
            count++;
        }
        Py_CLEAR(units);
        Py_CLEAR(prefix);
    }
    Py_DECREF(names);
    return PyLong_FromLong(count);
fail:
    Py_XDECREF(units);
    Py_XDECREF(prefix);
    Py_DECREF(names);
    return NULL;
}

/* ------------------------------------------------------------------ batch sends */
/* Java's String.hashCode of ASCII bytes, sign-extended (taghash.py). */
static long long java_hash_ascii(const unsigned char *p, Py_ssize_t n)
{
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        h = 31 * h + p[i];
    return (long long)(int32_t)h;
}

/* Value of the last pair named `name` with a non-empty value in props[0:n] (pairs are
 * name \x01 value, separated by \x02), as decode_properties would give it. */
static int last_value(const unsigned char *p, Py_ssize_t n, const char *name, Py_ssize_t nl,
                      const unsigned char **val, Py_ssize_t *vl)
{
    int found = 0;
    Py_ssize_t s = 0;
    while (s <= n) {
        const unsigned char *sep = memchr(p + s, 2, n - s);
        Py_ssize_t e = sep ? sep - p : n;
        if (e - s > nl && p[s + nl] == 1 && memcmp(p + s, name, nl) == 0 && e - s - nl - 1 > 0) {
            *val = p + s + nl + 1;
            *vl = e - s - nl - 1;
            found = 1;
        }
        if (!sep)
            break;
        s = e + 1;
    }
    return found;
}

static PyObject *reject(const char *status, PyObject *remark, PyObject *items)
{
    if (!remark) {
        Py_DECREF(items);
        return NULL;
    }
    return Py_BuildValue("(sNN)", status, remark, items);
}

/* When the properties string p[0:n] is canonical -- pairs name \x01 value, both non-empty,
 * no empty pair, no trailing \x02, no name twice, no WAIT or INNER_MULTI_QUEUE_OFFSET --
 * decoding it into a dict and encoding that again gives the same bytes. Returns the
 * INNER_MULTI_DISPATCH value of such a string (a new str), Py_True when the string is not
 * canonical or has no INNER_MULTI_DISPATCH pair (the caller takes the dict path), or NULL
 * with an exception set. */
#define MAX_CANON_PAIRS 32
static PyObject *canonical_multi(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t ns[MAX_CANON_PAIRS], nl[MAX_CANON_PAIRS];
    int pairs = 0;
    const unsigned char *mv = NULL;
    Py_ssize_t mvl = 0;
    Py_ssize_t s = 0;
    if (n == 0 || p[n - 1] == 2)
        Py_RETURN_TRUE;
    while (s < n) {
        const unsigned char *sep = memchr(p + s, 2, n - s);
        Py_ssize_t e = sep ? sep - p : n;
        const unsigned char *eq = memchr(p + s, 1, e - s);
        if (!eq || eq == p + s || eq + 1 == p + e || pairs == MAX_CANON_PAIRS)
            Py_RETURN_TRUE;  /* no separator, empty name or value, too many pairs */
        Py_ssize_t l = eq - (p + s);
        for (int k = 0; k < pairs; k++) {
            if (nl[k] == l && memcmp(p + ns[k], p + s, l) == 0)
                Py_RETURN_TRUE;
        }
        if ((l == 4 && memcmp(p + s, "WAIT", 4) == 0) ||
            (l == 24 && memcmp(p + s, "INNER_MULTI_QUEUE_OFFSET", 24) == 0))
            Py_RETURN_TRUE;
        if (l == 20 && memcmp(p + s, "INNER_MULTI_DISPATCH", 20) == 0) {
            mv = eq + 1;
            mvl = (p + e) - mv;
        }
        ns[pairs] = s;
        nl[pairs] = l;
        pairs++;
        s = e + 1;
    }
    if (!mv)
        Py_RETURN_TRUE;
    return PyUnicode_FromStringAndSize((const char *)mv, mvl);
}

/* split_batch(body, extra, fixed, max_record, max_body, max_props, x_tc, want_keys,
 *             want_uniq, multi_check)
 * Pass 1 of a MessageBatch put (put_batch.py _plan_encoded, same checks in the same order):
 * every sub-message of the batch body validated and planned. Returns a list of items
 *   (flag, body start, body length, properties bytes, tag code, record size, body CRC,
 *    KEYS value or None, UNIQ_KEY value or None, needs the dict path)
 * or (status name, remark, the items before it) for a message the store refuses, or None when a sub-message
 * needs the general Python path (non-ASCII properties). Properties are the sub-message's
 * own minus WAIT pairs, a \x02 when it does not end with one and `extra` is not empty, then
 * `extra`. The last field says how the caller finishes the properties: False, they are
 * final; with multi_check, for properties that mention INNER_MULTI_DISPATCH, the value of
 * that pair (a str) when the string is canonical (see canonical_multi: the caller appends
 * INNER_MULTI_QUEUE_OFFSET), else True (the caller re-encodes them from a dict). Either
 * way the size checks of such an item are the caller's. */
static PyObject *sp_split_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "split_batch(body: bytes, extra: bytes, ...8 more)");
        return NULL;
    }
    /* The truth tests first: they may run Python code (body and extra are immutable). */
    int want_keys = PyObject_IsTrue(args[7]), want_uniq = PyObject_IsTrue(args[8]);
    int multi_check = PyObject_IsTrue(args[9]);
    if (want_keys < 0 || want_uniq < 0 || multi_check < 0)
        return NULL;
    const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    const unsigned char *extra = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Py_ssize_t xl = PyBytes_GET_SIZE(args[1]);
    long long fixed, max_record, max_body, max_props, x_tc = 0;
    if (as_i64(args[2], &fixed, "fixed size") < 0 ||
        as_i64(args[3], &max_record, "max record") < 0 ||
        as_i64(args[4], &max_body, "max body") < 0 ||
        as_i64(args[5], &max_props, "max properties") < 0)
        return NULL;
    if (fixed < 0 || fixed > INT32_MAX || xl > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "split_batch: fixed size or extra out of range");
        return NULL;
    }
    int have_x_tc = args[6] != Py_None;
    if (have_x_tc && as_i64(args[6], &x_tc, "tag code") < 0)
        return NULL;
    PyObject *items = PyList_New(0);
    if (!items)
        return NULL;
    unsigned char *own = NULL;  /* scratch: one sub-message's properties */
    Py_ssize_t own_cap = 0;
    Py_ssize_t pos = 0;
    while (pos < n) {
        if (pos + 20 > n) {
            PyMem_Free(own);
            return reject("MESSAGE_ILLEGAL", PyUnicode_FromString("bad batch body: truncated batch sub-message header"), items);
        }
        int32_t size = (int32_t)get_u32(body + pos);
        int32_t flag = (int32_t)get_u32(body + pos + 12);
        int32_t blen = (int32_t)get_u32(body + pos + 16);
        Py_ssize_t b0 = pos + 20, end = pos + (Py_ssize_t)size;
        if (blen < 0 || (long long)size < 22 + (long long)blen || end > n) {
            PyMem_Free(own);
            return reject("MESSAGE_ILLEGAL", PyUnicode_FromString("bad batch body: bad batch sub-message size"), items);
        }
        Py_ssize_t p0 = b0 + blen;
        int16_t plen = (int16_t)((body[p0] << 8) | body[p0 + 1]);
        p0 += 2;
        if (plen < 0 || p0 + plen != end) {
            PyMem_Free(own);
            return reject("MESSAGE_ILLEGAL", PyUnicode_FromString("bad batch body: bad batch sub-message properties length"), items);
        }
        if (blen > max_body) {
            PyMem_Free(own);
            return reject("MESSAGE_ILLEGAL", PyUnicode_FromFormat("message body size %d exceeds %lld", (int)blen, max_body), items);
        }
        const unsigned char *src = body + p0;
        for (Py_ssize_t i = 0; i < plen; i++) {
            if (src[i] & 0x80)
                goto slow;
        }
        int need_dict = 0;
        if (multi_check && plen >= 21) {
            for (Py_ssize_t i = 0; i + 21 <= plen; i++) {
                if (src[i] == 'I' && memcmp(src + i, "INNER_MULTI_DISPATCH\x01", 21) == 0) {
                    need_dict = 1;
                    break;
                }
            }
        }
        /* own minus WAIT pairs */
        if (own_cap < plen + 1) {
            PyMem_Free(own);
            own_cap = plen + 64;
            own = PyMem_Malloc(own_cap);
            if (!own) {
                Py_DECREF(items);
                return PyErr_NoMemory();
            }
        }
        Py_ssize_t ol = 0, s = 0;
        while (s < plen) {
            const unsigned char *sep = memchr(src + s, 2, plen - s);
            Py_ssize_t e = sep ? sep - src : plen;
            Py_ssize_t seg_end = sep ? e + 1 : e;  /* with its \x02 */
            if (!(e - s >= 5 && memcmp(src + s, "WAIT\x01", 5) == 0)) {
                memcpy(own + ol, src + s, seg_end - s);
                ol += seg_end - s;
            }
            s = seg_end;
        }
        if (ol && xl && own[ol - 1] != 2)
            own[ol++] = 2;
        Py_ssize_t pbl = ol + xl;
        if (!need_dict && pbl > max_props) {
            PyMem_Free(own);
            return reject("PROPERTIES_SIZE_EXCEEDED", PyUnicode_FromFormat("properties size %zd exceeds %lld", pbl, max_props), items);
        }
        long long total = fixed + blen + pbl;
        if (!need_dict && total > max_record) {
            PyMem_Free(own);
            return reject("MESSAGE_ILLEGAL", PyUnicode_FromString("record larger than a CommitLog file"), items);
        }
        PyObject *pb = PyBytes_FromStringAndSize(NULL, pbl);
        if (!pb)
            goto fail;
        memcpy(PyBytes_AS_STRING(pb), own, ol);
        memcpy(PyBytes_AS_STRING(pb) + ol, extra, xl);
        const unsigned char *v;
        Py_ssize_t vl;
        long long tc = x_tc;
        if (!have_x_tc)
            tc = last_value(own, ol, "TAGS", 4, &v, &vl) ? java_hash_ascii(v, vl) : 0;
        PyObject *keys = Py_None, *uniq = Py_None;
        Py_INCREF(Py_None);
        Py_INCREF(Py_None);
        if (want_keys && last_value(own, ol, "KEYS", 4, &v, &vl)) {
            Py_DECREF(keys);
            keys = PyBytes_FromStringAndSize((const char *)v, vl);
        }
        if (want_uniq && last_value(own, ol, "UNIQ_KEY", 8, &v, &vl)) {
            Py_DECREF(uniq);
            uniq = PyBytes_FromStringAndSize((const char *)v, vl);
        }
        if (!keys || !uniq) {
            Py_XDECREF(keys);
            Py_XDECREF(uniq);
            Py_DECREF(pb);
            goto fail;
        }
        uint32_t crc = crc32_buf(body + b0, blen) & 0x7FFFFFFFu;
        PyObject *how = Py_NewRef(Py_False);
        if (need_dict) {
            Py_DECREF(how);
            how = canonical_multi((const unsigned char *)PyBytes_AS_STRING(pb), pbl);
            if (!how) {
                Py_DECREF(pb);
                Py_DECREF(keys);
                Py_DECREF(uniq);
                goto fail;
            }
        }
        PyObject *item = Py_BuildValue("(innNLLkNNN)", (int)flag, b0, (Py_ssize_t)blen, pb, tc,
                                       total, (unsigned long)crc, keys, uniq, how);
        if (!item || PyList_Append(items, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        pos = end;
    }
    PyMem_Free(own);
    return items;
slow:
    PyMem_Free(own);
    Py_DECREF(items);
    Py_RETURN_NONE;
fail:
    PyMem_Free(own);
    Py_DECREF(items);
    return NULL;
}

static int add_key_entry(PyObject *pending, char prefix, int32_t bucket, PyObject *topic_hash,
                         const char *key, Py_ssize_t kl, long long store_ms, long long phys,
                         long long total)
{
    Py_ssize_t tl = PyBytes_GET_SIZE(topic_hash);
    Py_ssize_t tk = tl + kl;
    if (tk > 1024)  /* key_index._MAX_KEY_BYTES: not indexed */
        return 0;
    PyObject *k = PyBytes_FromStringAndSize(NULL, 1 + 4 + 2 + tk + 16);
    PyObject *val = PyBytes_FromStringAndSize(NULL, 4);
    if (!k || !val) {
        Py_XDECREF(k);
        Py_XDECREF(val);
        return -1;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(k);
    p[0] = prefix;
    put_u32(p + 1, (uint32_t)bucket);
    put_u16(p + 5, (uint32_t)tk);
    memcpy(p + 7, PyBytes_AS_STRING(topic_hash), tl);
    memcpy(p + 7 + tl, key, kl);
    put_u64(p + 7 + tk, (uint64_t)store_ms);
    put_u64(p + 15 + tk, (uint64_t)phys);
    put_u32((unsigned char *)PyBytes_AS_STRING(val), (uint32_t)total);
    PyObject *pair = PyTuple_Pack(2, k, val);
    Py_DECREF(k);
    Py_DECREF(val);
    if (!pair)
        return -1;
    int r = PyList_Append(pending, pair);
    Py_DECREF(pair);
    return r;
}

/* write_batch(mm, pos, limit, items, i, queue_id, queue_offset, base, sys_flag, born_ts,
 *             born_host, store_ms, store_host, reconsume, body, tail, hex_host, ids,
 *             cq_units, pending, topic_hash, bucket, x_keys, x_uniq) -> (i, pos)
 * Pass 2 of a MessageBatch put: records of items[i:] (split_batch items; the first item
 * of the batch has queue offset `queue_offset`, item i has queue_offset + i) packed into
 * `mm` (an exact bytearray or mmap) from `pos` while they end at or before `limit`. For
 * each: its offset msgId (hex_host + %016X of base + pos) appended to `ids`, its
 * ConsumeQueue unit (phys int64, size int32, tag code int64) to the bytearray `cq_units`,
 * and, when `pending` is a list, its key-index entries (key_index.py layout; `topic_hash`
 * is topic + "#"; x_keys / x_uniq, when not None, are batch-level values that replace the
 * item's). Returns where it stopped: the next item and position (the caller rolls to a
 * new file and goes on). Checked as write_record checks, before a byte is written: exact
 * types, 0 <= pos <= len(mm), 0 <= i <= len(items), and the fields of every item from i
 * (int32 flag, body slice inside `body`, size matching its parts, properties at most 32767
 * bytes, CRC in uint32, keys bytes or None). */
static int bad_item(const char *why)
{
    PyErr_Format(PyExc_ValueError, "write_batch: %s", why);
    return -1;
}

/* The fields of one split_batch item, checked. */
static int batch_item(PyObject *it, Py_ssize_t bn, Py_ssize_t tlen, long long *flag,
                      long long *b0, long long *blen, long long *tc, long long *total,
                      long long *crc)
{
    if (!PyTuple_CheckExact(it) || PyTuple_GET_SIZE(it) != 10) {
        PyErr_SetString(PyExc_TypeError, "write_batch: an item must be a tuple of 10");
        return -1;
    }
    PyObject *pb = PyTuple_GET_ITEM(it, 3), *keys = PyTuple_GET_ITEM(it, 7);
    PyObject *uniq = PyTuple_GET_ITEM(it, 8);
    if (as_i32(PyTuple_GET_ITEM(it, 0), flag, "flag") < 0 ||
        as_i64(PyTuple_GET_ITEM(it, 1), b0, "body start") < 0 ||
        as_i64(PyTuple_GET_ITEM(it, 2), blen, "body length") < 0 ||
        as_i64(PyTuple_GET_ITEM(it, 4), tc, "tag code") < 0 ||
        as_i64(PyTuple_GET_ITEM(it, 5), total, "record size") < 0 ||
        as_i64(PyTuple_GET_ITEM(it, 6), crc, "body CRC") < 0)
        return -1;
    if (!PyBytes_CheckExact(pb) || (keys != Py_None && !PyBytes_CheckExact(keys)) ||
        (uniq != Py_None && !PyBytes_CheckExact(uniq))) {
        PyErr_SetString(PyExc_TypeError, "write_batch: properties and keys must be bytes");
        return -1;
    }
    if (*b0 < 0 || *blen < 0 || *b0 > bn || *blen > bn - *b0 || *blen > INT32_MAX)
        return bad_item("body slice outside the batch body");
    if (PyBytes_GET_SIZE(pb) > 32767)
        return bad_item("properties longer than 32767 bytes");
    if (*total != 88 + *blen + tlen + 2 + PyBytes_GET_SIZE(pb) || *total > INT32_MAX)
        return bad_item("record size does not match its parts");
    if (*crc < 0 || *crc > UINT32_MAX)
        return bad_item("body CRC out of range");
    return 0;
}

static PyObject *sp_write_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 24) {
        PyErr_SetString(PyExc_TypeError, "write_batch takes 24 arguments");
        return NULL;
    }
    long long pos, limit, i0, qid, qoff, base, bucket;
    struct rec_common c;
    if (as_i64(args[1], &pos, "pos") < 0 || as_i64(args[2], &limit, "limit") < 0 ||
        as_i64(args[4], &i0, "item index") < 0 || as_i32(args[5], &qid, "queue id") < 0 ||
        as_i64(args[6], &qoff, "queue offset") < 0 || as_i64(args[7], &base, "base") < 0 ||
        common_ints(args + 8, &c) < 0 || as_i32(args[21], &bucket, "bucket") < 0)
        return NULL;
    PyObject *items = args[3], *born = args[10], *host = args[12], *body = args[14];
    PyObject *tail = args[15], *hexhost = args[16], *ids = args[17], *cq_units = args[18];
    PyObject *pending = args[19], *topic_hash = args[20], *x_keys = args[22], *x_uniq = args[23];
    if (!PyList_CheckExact(items) || !PyBytes_CheckExact(born) || !PyBytes_CheckExact(host) ||
        !PyBytes_CheckExact(body) || !PyBytes_CheckExact(tail) ||
        !PyUnicode_CheckExact(hexhost) || !PyList_CheckExact(ids) ||
        !PyByteArray_CheckExact(cq_units) || (pending != Py_None && !PyList_CheckExact(pending)) ||
        !PyBytes_CheckExact(topic_hash) || (x_keys != Py_None && !PyList_CheckExact(x_keys)) ||
        (x_uniq != Py_None && !PyBytes_CheckExact(x_uniq))) {
        PyErr_SetString(PyExc_TypeError, "write_batch: bad argument types");
        return NULL;
    }
    if (common_hosts(args + 8, &c) < 0)
        return NULL;
    if (cq_units == args[0] || ids == items || pending == items || pending == ids ||
        (x_keys != Py_None && (x_keys == ids || x_keys == pending))) {
        PyErr_SetString(PyExc_ValueError, "write_batch: an output is also an input");
        return NULL;
    }
    if (x_keys != Py_None) {
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(x_keys); k++) {
            if (!PyBytes_CheckExact(PyList_GET_ITEM(x_keys, k))) {
                PyErr_SetString(PyExc_TypeError, "keys must be bytes");
                return NULL;
            }
        }
    }
    Py_ssize_t hl;
    const char *hexs = PyUnicode_AsUTF8AndSize(hexhost, &hl);
    if (!hexs || hl > 64)
        return hexs ? (PyErr_SetString(PyExc_ValueError, "hex host too long"), NULL) : NULL;
    /* No Python code runs from here on (exact types); the item list is still snapshotted
     * and every item held while it is used. */
    PyObject *snap = PyList_AsTuple(items);
    if (!snap)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(snap);
    if (i0 < 0 || i0 > count) {
        Py_DECREF(snap);
        PyErr_SetString(PyExc_ValueError, "write_batch: item index out of range");
        return NULL;
    }
    if (qoff > INT64_MAX - count || base < 0) {
        Py_DECREF(snap);
        PyErr_SetString(PyExc_OverflowError, "write_batch: queue offset or base out of range");
        return NULL;
    }
    Py_buffer mm;
    if (get_target(args[0], &mm) < 0) {
        Py_DECREF(snap);
        return NULL;
    }
    if (pos < 0 || pos > mm.len || base > INT64_MAX - mm.len) {
        PyErr_SetString(PyExc_ValueError, "write_batch: position outside the mapping");
        goto fail;
    }
    if (limit > mm.len)
        limit = mm.len;
    if (limit < 0)
        limit = 0;
    const char *bsrc = PyBytes_AS_STRING(body);
    Py_ssize_t bn = PyBytes_GET_SIZE(body);
    Py_ssize_t tlen = PyBytes_GET_SIZE(tail);
    Py_ssize_t i = (Py_ssize_t)i0;
    char idbuf[96];
    memcpy(idbuf, hexs, hl);
    for (Py_ssize_t j = i; j < count; j++) {  /* all checked before a byte is written */
        long long f, b, l, t, r, c;
        if (batch_item(PyTuple_GET_ITEM(snap, j), bn, tlen, &f, &b, &l, &t, &r, &c) < 0)
            goto fail;
    }
    for (; i < count; i++) {
        PyObject *it = PyTuple_GET_ITEM(snap, i);  /* held by the snapshot */
        long long flag, b0, blen, tc, total, crc;
        if (batch_item(it, bn, tlen, &flag, &b0, &blen, &tc, &total, &crc) < 0)
            goto fail;
        if (total > limit - pos)
            break;
        PyObject *pb = PyTuple_GET_ITEM(it, 3);
        Py_ssize_t plen = PyBytes_GET_SIZE(pb);
        long long phys = base + pos;
        pack_record((unsigned char *)mm.buf + pos, total, (uint32_t)crc, qid, flag, qoff + i,
                    phys, &c, 0, bsrc + b0, (Py_ssize_t)blen,
                    PyBytes_AS_STRING(tail), tlen, PyBytes_AS_STRING(pb), plen);
        pos += total;
        /* offset msgId */
        int dl = snprintf(idbuf + hl, sizeof idbuf - hl, "%016llX", (unsigned long long)phys);
        PyObject *id = PyUnicode_FromStringAndSize(idbuf, hl + dl);
        if (!id || PyList_Append(ids, id) < 0) {
            Py_XDECREF(id);
            goto fail;
        }
        Py_DECREF(id);
        /* ConsumeQueue unit */
        unsigned char unit[20];
        put_u64(unit, (uint64_t)phys);
        put_u32(unit + 8, (uint32_t)total);
        put_u64(unit + 12, (uint64_t)tc);
        Py_ssize_t ul = PyByteArray_GET_SIZE(cq_units);
        if (PyByteArray_Resize(cq_units, ul + 20) < 0) {
            if (PyErr_ExceptionMatches(PyExc_BufferError)) {  /* exported elsewhere */
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "write_batch: cq_units cannot grow");
            }
            goto fail;
        }
        memcpy(PyByteArray_AS_STRING(cq_units) + ul, unit, 20);
        if (pending == Py_None)
            continue;
        /* key index: KEYS (space-separated), then UNIQ_KEY */
        if (x_keys != Py_None) {
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(x_keys); k++) {
                PyObject *key = PyList_GET_ITEM(x_keys, k);  /* checked exact bytes */
                if (add_key_entry(pending, 'k', (int32_t)bucket, topic_hash, PyBytes_AS_STRING(key),
                                  PyBytes_GET_SIZE(key), c.store_ms, phys, total) < 0)
                    goto fail;
            }
        } else if (PyTuple_GET_ITEM(it, 7) != Py_None) {
            PyObject *kv = PyTuple_GET_ITEM(it, 7);
            const char *ks = PyBytes_AS_STRING(kv);
            Py_ssize_t kn = PyBytes_GET_SIZE(kv), s = 0;
            while (s < kn) {
                const char *sp = memchr(ks + s, ' ', kn - s);
                Py_ssize_t e = sp ? sp - ks : kn;
                if (e > s && add_key_entry(pending, 'k', (int32_t)bucket, topic_hash, ks + s, e - s,
                                           c.store_ms, phys, total) < 0)
                    goto fail;
                s = e + 1;
            }
        }
        PyObject *uq = x_uniq != Py_None ? x_uniq : PyTuple_GET_ITEM(it, 8);
        if (uq != Py_None && PyBytes_GET_SIZE(uq) &&
            add_key_entry(pending, 'q', (int32_t)bucket, topic_hash, PyBytes_AS_STRING(uq),
                          PyBytes_GET_SIZE(uq), c.store_ms, phys, total) < 0)
            goto fail;
    }
    PyBuffer_Release(&mm);
    Py_DECREF(snap);
    return Py_BuildValue("(nL)", i, pos);
fail:
    PyBuffer_Release(&mm);
    Py_DECREF(snap);
    return NULL;
}

/* ==== s5-mqtt: the MQTT read-path scanners' shared argument check ======================
 * scan_src: the (src: bytes | bytearray, pos: int, ...) head of scan_publishes and
 * scan_pubacks. Sets *p, *n (the buffer, borrowed from args[0]) and *pos; raises TypeError
 * with `usage` unless there are `want` arguments and src is exactly bytes or bytearray, and
 * ValueError (naming `name`) for a pos outside [0, len(src)]. Returns 0, or -1 on error. */
static int scan_src(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                    const char *name, const char *usage, const unsigned char **p,
                    Py_ssize_t *n, long long *pos)
{
    if (nargs != want || (!PyBytes_CheckExact(args[0]) && !PyByteArray_CheckExact(args[0]))) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (as_i64(args[1], pos, "pos") < 0)
        return -1;
    if (PyBytes_CheckExact(args[0])) {
        *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
        *n = PyBytes_GET_SIZE(args[0]);
    } else {
        *p = (const unsigned char *)PyByteArray_AS_STRING(args[0]);
        *n = PyByteArray_GET_SIZE(args[0]);
    }
    if (*pos < 0 || *pos > *n) {
        PyErr_Format(PyExc_ValueError, "%s: pos outside the buffer", name);
        return -1;
    }
    return 0;
}
/* ==== end s5-mqtt ==== */

/* ==== s4-perf: the MQTT fan-in's per-message work, a batch per call ==================
 * plan_batch_lmqs / stage_batch_lmqs: the MessageBatch put of the MQTT gateway, where
 * every sub-message carries INNER_MULTI_DISPATCH (split_batch gives its value when the
 * properties are canonical). _plan_dicts and _dispatch_native did the planning per message
 * in Python; these two do the whole batch, so a batch costs one call each plus O(#LMQs)
 * Python. scan_publishes: a socket read's 3.x PUBLISH packets decoded in one call
 * (gateway/mqtt/codec.py). Each takes only the usual case and leaves the rest to the
 * Python code (which stays the reference: tests compare them). */

/* plan_batch_lmqs(items, memo, cache, topic, fixed, limit, max_props)
 *   -> (names, bases, first offsets | None) | (status name, remark) | None
 * items: split_batch items. An item whose last field is False is left alone; one whose
 * last field is a str (its INNER_MULTI_DISPATCH value) gets INNER_MULTI_QUEUE_OFFSET
 * appended to its properties and its record size grown, as _plan_dicts does, with offsets
 * from `cache` (LmqIndex.cache: name -> next offset) counted up through the batch. Returns
 * None, with nothing changed, unless every such item's value is a key of `memo` (the store's
 * split, duplicate-free name lists), every name is an exact str cached with an offset > 0
 * (an LMQ that exists, so none is created) and `topic` is not cached. Else: `names`, per
 * item the tuple of its LMQ names or None; `bases`, each LMQ's first offset in the batch;
 * the first item's offsets (None when it has no dispatch). A properties string longer than
 * max_props or a record larger than `limit` is refused as _plan_dicts refuses it (status
 * name, remark); the items before it are already changed then (the batch is refused). */
static PyObject *sp_plan_batch_lmqs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long fixed, limit, max_props;
    if (nargs != 7 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) ||
        !PyDict_CheckExact(args[2]) || !PyUnicode_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "plan_batch_lmqs(items: list, memo: dict, cache: dict, topic: str, "
                        "fixed: int, limit: int, max_props: int)");
        return NULL;
    }
    if (as_i64(args[4], &fixed, "fixed size") < 0 || as_i64(args[5], &limit, "limit") < 0 ||
        as_i64(args[6], &max_props, "max properties") < 0)
        return NULL;
    if (fixed < 0 || fixed > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "plan_batch_lmqs: fixed size out of range");
        return NULL;
    }
    PyObject *items = args[0], *memo = args[1], *cache = args[2];
    PyObject *snap = PyList_AsTuple(items);  /* strong: the list may change below */
    if (!snap)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(snap);
    PyObject *tuples = NULL, *bases = NULL, *next = NULL, *names = NULL, *first = NULL;
    PyObject *ret = NULL;
    char *text = NULL;
    int has = PyDict_Contains(cache, args[3]);
    if (has != 0) {
        ret = has < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    tuples = PyDict_New();  /* dispatch value -> tuple of names (held here) */
    bases = PyDict_New();
    names = PyList_New(n);
    if (!tuples || !bases || !names)
        goto done;
    Py_ssize_t most = 0;  /* the longest name tuple */
    /* Pass 1: everything checked, nothing changed. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(snap, i);
        if (!PyTuple_CheckExact(it) || PyTuple_GET_SIZE(it) != 10) {
            PyErr_SetString(PyExc_TypeError, "plan_batch_lmqs: an item must be a tuple of 10");
            goto done;
        }
        PyObject *how = PyTuple_GET_ITEM(it, 9);
        if (how == Py_False) {
            PyList_SET_ITEM(names, i, Py_NewRef(Py_None));
            continue;
        }
        if (!PyUnicode_CheckExact(how) || !PyBytes_CheckExact(PyTuple_GET_ITEM(it, 3))) {
            ret = Py_NewRef(Py_None);  /* the dict path */
            goto done;
        }
        PyObject *t = PyDict_GetItemWithError(tuples, how);
        if (!t) {
            if (PyErr_Occurred())
                goto done;
            PyObject *lst = PyDict_GetItemWithError(memo, how);
            if (!lst || !PyList_CheckExact(lst)) {
                ret = lst || !PyErr_Occurred() ? Py_NewRef(Py_None) : NULL;
                goto done;
            }
            PyObject *tup = PyList_AsTuple(lst);
            if (!tup)
                goto done;
            int r = PyDict_SetItem(tuples, how, tup);
            Py_DECREF(tup);
            if (r < 0)
                goto done;
            t = tup;  /* held by `tuples` */
            Py_ssize_t m = PyTuple_GET_SIZE(t);
            if (m == 0) {
                ret = Py_NewRef(Py_None);
                goto done;
            }
            if (m > most)
                most = m;
            for (Py_ssize_t k = 0; k < m; k++) {
                PyObject *name = PyTuple_GET_ITEM(t, k);
                if (!PyUnicode_CheckExact(name)) {
                    ret = Py_NewRef(Py_None);
                    goto done;
                }
                PyObject *off = PyDict_GetItemWithError(cache, name);
                long long o;
                if (!off) {
                    ret = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
                    goto done;
                }
                Py_INCREF(off);
                r = as_i64(off, &o, "a cached offset");
                if (r == 0 && o <= 0) {
                    Py_DECREF(off);
                    ret = Py_NewRef(Py_None);  /* a new LMQ: counted by the Python path */
                    goto done;
                }
                r = r < 0 ? -1 : PyDict_SetDefault(bases, name, off) ? 0 : -1;
                Py_DECREF(off);
                if (r < 0)
                    goto done;
            }
        }
        PyList_SET_ITEM(names, i, Py_NewRef(t));
    }
    /* Duplicates inside one list would need one offset for both: the memo holds none,
     * but a list changed since could; the Python path handles them. */
    {
        Py_ssize_t pos = 0;
        PyObject *key, *val;
        while (PyDict_Next(tuples, &pos, &key, &val)) {
            Py_ssize_t m = PyTuple_GET_SIZE(val);
            for (Py_ssize_t a = 0; a < m; a++)
                for (Py_ssize_t b = a + 1; b < m; b++) {
                    int eq = PyUnicode_Compare(PyTuple_GET_ITEM(val, a), PyTuple_GET_ITEM(val, b));
                    if (eq == -1 && PyErr_Occurred())
                        goto done;
                    if (eq == 0) {
                        ret = Py_NewRef(Py_None);
                        goto done;
                    }
                }
        }
    }
    /* Pass 2: offsets counted through the batch, properties and sizes. */
    next = PyDict_Copy(bases);
    text = PyMem_Malloc(OFFSETS_PAIR_LEN + (size_t)(most ? most : 1) * 21 + 1);
    if (!next || !text) {
        if (!text)
            PyErr_NoMemory();
        goto done;
    }
    memcpy(text, OFFSETS_PAIR, OFFSETS_PAIR_LEN);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(names, i);
        if (t == Py_None)
            continue;
        PyObject *it = PyTuple_GET_ITEM(snap, i);
        Py_ssize_t m = PyTuple_GET_SIZE(t), tl = OFFSETS_PAIR_LEN;
        PyObject *offs = NULL;
        if (i == 0 && !(offs = first = PyList_New(m)))
            goto done;
        for (Py_ssize_t k = 0; k < m; k++) {
            PyObject *name = PyTuple_GET_ITEM(t, k);
            PyObject *cur = PyDict_GetItemWithError(next, name);  /* exact int, set below */
            long long o;
            if (!cur) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "plan_batch_lmqs: a name went missing");
                goto done;
            }
            if (as_i64(cur, &o, "an offset") < 0)
                goto done;
            if (o == INT64_MAX) {
                PyErr_SetString(PyExc_OverflowError, "LMQ offset out of int64 range");
                goto done;
            }
            if (offs)
                PyList_SET_ITEM(offs, k, Py_NewRef(cur));
            PyObject *nx = PyLong_FromLongLong(o + 1);
            if (!nx || PyDict_SetItem(next, name, nx) < 0) {
                Py_XDECREF(nx);
                goto done;
            }
            Py_DECREF(nx);
            if (k)
                text[tl++] = ',';
            tl += format_i64(text + tl, o);
        }
        PyObject *own = PyTuple_GET_ITEM(it, 3);
        Py_ssize_t ol = PyBytes_GET_SIZE(own), pbl = ol + tl;
        long long blen, total;
        if (as_i64(PyTuple_GET_ITEM(it, 2), &blen, "body length") < 0)
            goto done;
        if (pbl > max_props) {
            ret = Py_BuildValue("(sN)", "PROPERTIES_SIZE_EXCEEDED",
                                PyUnicode_FromFormat("properties size %zd exceeds %lld", pbl,
                                                     max_props));
            goto done;
        }
        if (blen < 0 || blen > INT32_MAX || (total = fixed + blen + pbl) > limit) {
            ret = Py_BuildValue("(ss)", "MESSAGE_ILLEGAL", "record larger than a CommitLog file");
            goto done;
        }
        PyObject *pb = PyBytes_FromStringAndSize(NULL, pbl);
        if (!pb)
            goto done;
        memcpy(PyBytes_AS_STRING(pb), PyBytes_AS_STRING(own), ol);
        memcpy(PyBytes_AS_STRING(pb) + ol, text, tl);
        PyObject *tot = PyLong_FromLongLong(total);
        if (!tot) {
            Py_DECREF(pb);
            goto done;
        }
        PyObject *nt = PyTuple_Pack(10, PyTuple_GET_ITEM(it, 0), PyTuple_GET_ITEM(it, 1),
                                    PyTuple_GET_ITEM(it, 2), pb, PyTuple_GET_ITEM(it, 4), tot,
                                    PyTuple_GET_ITEM(it, 6), PyTuple_GET_ITEM(it, 7),
                                    PyTuple_GET_ITEM(it, 8), Py_False);
        Py_DECREF(pb);
        Py_DECREF(tot);
        if (!nt)
            goto done;
        /* the list may have been shortened meanwhile (no Python code ran, but be exact) */
        if (i >= PyList_GET_SIZE(items)) {
            Py_DECREF(nt);
            PyErr_SetString(PyExc_ValueError, "plan_batch_lmqs: the item list changed");
            goto done;
        }
        if (PyList_SetItem(items, i, nt) < 0)  /* steals nt */
            goto done;
    }
    ret = PyTuple_Pack(3, names, bases, first ? first : Py_None);
done:
    PyMem_Free(text);
    Py_XDECREF(first);
    Py_XDECREF(names);
    Py_XDECREF(next);
    Py_XDECREF(bases);
    Py_XDECREF(tuples);
    Py_DECREF(snap);
    return ret;
}

/* stage_batch_lmqs(staged, cache, names, bases, cq_units, store_ms) -> int
 * After write_batch: the LMQ units of a batch planned by plan_batch_lmqs. Item i's
 * ConsumeQueue unit in cq_units (20 bytes at 20 * i: phys int64, size int32, tag code
 * int64) gives its LMQ unit (lmq_index.LMQ_UNIT: phys, size, tag code, store_ms), staged
 * under each of its names at the next offset from `bases`, as LmqIndex.add_planned_many
 * stages them; cache[name] ends one past each LMQ's last offset. Returns the number of
 * units staged. Everything is checked before anything is staged. */
static PyObject *sp_stage_batch_lmqs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long store_ms;
    if (nargs != 6 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) ||
        !PyList_CheckExact(args[2]) || !PyDict_CheckExact(args[3]) ||
        !PyByteArray_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "stage_batch_lmqs(staged: dict, cache: dict, names: list, bases: dict, "
                        "cq_units: bytearray, store_ms: int)");
        return NULL;
    }
    if (as_i64(args[5], &store_ms, "store timestamp") < 0)
        return NULL;
    PyObject *staged = args[0], *cache = args[1], *bases = args[3];
    PyObject *snap = PyList_AsTuple(args[2]);
    if (!snap)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(snap);
    PyObject *next = NULL, *ret = NULL;
    /* a copy of the units: the bytearray could be resized by a dict lookup's code */
    Py_ssize_t ulen = PyByteArray_GET_SIZE(args[4]);
    if (ulen < n * 20) {
        PyErr_SetString(PyExc_ValueError, "stage_batch_lmqs: cq_units shorter than the items");
        goto done;
    }
    next = PyDict_Copy(bases);
    if (!next)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {  /* checks */
        PyObject *t = PyTuple_GET_ITEM(snap, i);
        if (t == Py_None)
            continue;
        if (!PyTuple_CheckExact(t)) {
            PyErr_SetString(PyExc_TypeError, "stage_batch_lmqs: names must be tuples or None");
            goto done;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); k++) {
            PyObject *name = PyTuple_GET_ITEM(t, k), *b;
            long long o;
            if (!PyUnicode_CheckExact(name)) {
                PyErr_SetString(PyExc_TypeError, "LMQ names must be str");
                goto done;
            }
            if (!(b = PyDict_GetItemWithError(next, name))) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "stage_batch_lmqs: a name has no base");
                goto done;
            }
            if (as_i64(b, &o, "a base offset") < 0)
                goto done;
            if (o < 0 || o > INT64_MAX - n) {
                PyErr_SetString(PyExc_ValueError, "LMQ offset out of range");
                goto done;
            }
            PyObject *u = PyDict_GetItemWithError(staged, name);
            if (!u && PyErr_Occurred())
                goto done;
            if (u && !PyList_CheckExact(u)) {
                PyErr_SetString(PyExc_TypeError, "staged units must be lists");
                goto done;
            }
        }
    }
    if (PyByteArray_GET_SIZE(args[4]) < n * 20) {
        PyErr_SetString(PyExc_ValueError, "stage_batch_lmqs: cq_units changed");
        goto done;
    }
    unsigned char *cq = NULL;
    cq = PyMem_Malloc(n * 20 + 1);
    if (!cq) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(cq, PyByteArray_AS_STRING(args[4]), n * 20);
    long long count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(snap, i);
        if (t == Py_None)
            continue;
        PyObject *unit = PyBytes_FromStringAndSize(NULL, 28);
        if (!unit)
            goto fail;
        unsigned char *up = (unsigned char *)PyBytes_AS_STRING(unit);
        memcpy(up, cq + 20 * i, 20);  /* phys, size, tag code: the same big-endian fields */
        put_u64(up + 20, (uint64_t)store_ms);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); k++) {
            PyObject *name = PyTuple_GET_ITEM(t, k);
            PyObject *cur = PyDict_GetItemWithError(next, name);
            if (!cur) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "stage_batch_lmqs: a name went missing");
                Py_DECREF(unit);
                goto fail;
            }
            Py_INCREF(cur);
            long long o = PyLong_AsLongLong(cur);  /* an exact int (checked or ours) */
            PyObject *nx = o == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(o + 1);
            PyObject *units = nx ? PyDict_GetItemWithError(staged, name) : NULL;
            int r = -1;
            if (nx && !units && !PyErr_Occurred()) {
                units = PyList_New(2);
                if (units) {
                    PyList_SET_ITEM(units, 0, Py_NewRef(cur));
                    PyList_SET_ITEM(units, 1, Py_NewRef(unit));
                    r = PyDict_SetItem(staged, name, units);
                    Py_DECREF(units);
                }
            } else if (units && PyList_CheckExact(units)) {
                Py_INCREF(units);
                r = PyList_Append(units, cur) < 0 || PyList_Append(units, unit) < 0 ? -1 : 0;
                Py_DECREF(units);
            } else if (units) {
                PyErr_SetString(PyExc_TypeError, "staged units must be lists");
            }
            if (r == 0)
                r = PyDict_SetItem(next, name, nx);
            Py_DECREF(cur);
            Py_XDECREF(nx);
            if (r < 0) {
                Py_DECREF(unit);
                goto fail;
            }
            count++;
        }
        Py_DECREF(unit);
    }
    PyMem_Free(cq);
    {
        Py_ssize_t pos = 0;
        PyObject *key, *val;
        while (PyDict_Next(next, &pos, &key, &val)) {
            if (PyDict_SetItem(cache, key, val) < 0)
                goto done;
        }
    }
    ret = PyLong_FromLongLong(count);
    goto done;
fail:
    PyMem_Free(cq);
done:
    Py_XDECREF(next);
    Py_DECREF(snap);
    return ret;
}
/* scan_publishes(src, pos, max_packet_size) -> (run: list, pos)
 * The MQTT gateway's read path (gateway/mqtt/codec.py MqttCodec.feed, 3.1/3.1.1 server
 * side): the complete PUBLISH packets at src[pos:] (bytes or bytearray), decoded as
 * (topic str, payload bytes, fixed-header flags int, packet id int or None) tuples, up to
 * the first packet that is not a PUBLISH, is incomplete, or fails any check the Python
 * decoder makes (QoS 3, DUP on QoS 0, a truncated or empty topic, a topic that is not
 * UTF-8 or holds + # U+0000, packet id 0, longer than max_packet_size, a remaining length
 * over 4 bytes): the Python decoder takes that packet (and raises its error). Returns the
 * tuples and the position after the last one. Consecutive packets with the same topic
 * bytes share one str. No Python code runs while the buffer is read. */
static PyObject *sp_scan_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long pos, limit;
    const unsigned char *p;
    Py_ssize_t n;
    if (scan_src(args, nargs, 3, "scan_publishes",
                 "scan_publishes(src: bytes | bytearray, pos: int, max_packet_size: int)",
                 &p, &n, &pos) < 0 ||
        as_i64(args[2], &limit, "max packet size") < 0)
        return NULL;
    PyObject *run = PyList_New(0);
    if (!run)
        return NULL;
    PyObject *prev = NULL;  /* the last topic (borrowed from `run`) */
    const unsigned char *prev_b = NULL;
    Py_ssize_t prev_l = 0;
    while (pos < n) {
        unsigned char first = p[pos];
        if ((first >> 4) != 3)
            break;
        Py_ssize_t q = (Py_ssize_t)pos + 1;
        long long length = 0;
        int shift = 0, done = 0;
        while (q < n && shift < 28) {
            unsigned char b = p[q++];
            length |= (long long)(b & 0x7F) << shift;
            if (b < 0x80) {
                done = 1;
                break;
            }
            shift += 7;
        }
        if (!done)
            break;  /* incomplete, or a remaining length over 4 bytes (Python raises) */
        if (q - pos + length > limit || q + length > n)
            break;
        Py_ssize_t end = q + (Py_ssize_t)length;
        int qos = (first >> 1) & 3;
        if (qos == 3 || ((first & 0x08) && !qos) || q + 2 > end)
            break;
        Py_ssize_t tl = ((Py_ssize_t)p[q] << 8) | p[q + 1];
        Py_ssize_t t0 = q + 2, stop = t0 + tl;
        if (tl == 0 || stop > end || memchr(p + t0, '+', tl) || memchr(p + t0, '#', tl) ||
            memchr(p + t0, 0, tl))
            break;
        PyObject *pid = Py_None;
        long id = 0;
        if (qos) {
            if (stop + 2 > end)
                break;
            id = ((long)p[stop] << 8) | p[stop + 1];
            if (!id)
                break;
            stop += 2;
        }
        PyObject *topic;
        if (prev && tl == prev_l && memcmp(p + t0, prev_b, tl) == 0) {
            topic = Py_NewRef(prev);
        } else {
            topic = PyUnicode_DecodeUTF8((const char *)p + t0, tl, "strict");
            if (!topic) {
                if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    PyErr_Clear();
                    break;  /* the Python decoder refuses it */
                }
                goto fail;
            }
        }
        if (qos && !(pid = PyLong_FromLong(id))) {
            Py_DECREF(topic);
            goto fail;
        }
        PyObject *flags = PyLong_FromLong(first & 0x0F);  /* small ints: cached */
        PyObject *payload = PyBytes_FromStringAndSize((const char *)p + stop, end - stop);
        PyObject *item = flags && payload ? PyTuple_Pack(4, topic, payload, flags, pid) : NULL;
        Py_XDECREF(flags);
        Py_XDECREF(payload);
        if (qos)
            Py_DECREF(pid);
        if (!item || PyList_Append(run, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(topic);
            goto fail;
        }
        Py_DECREF(item);
        prev = topic;  /* still held by the item in `run` */
        Py_DECREF(topic);
        prev_b = p + t0;
        prev_l = tl;
        pos = end;
    }
    return Py_BuildValue("(NL)", run, pos);
fail:
    Py_DECREF(run);
    return NULL;
}
/* ==== end s4-perf ==== */
/* ==== s4-perf2: a run of subscribers' PUBACKs in one call ==================================
 * scan_pubacks(src, pos) -> (packet_ids: list[int], pos)
 * The MQTT gateway's read path (gateway/mqtt/codec.py MqttCodec.feed, server side): the
 * complete 4-byte PUBACKs (0x40, remaining length 2, packet id) at src[pos:] (bytes or
 * bytearray), up to the first packet that is anything else (other flags, a longer PUBACK
 * with a reason code or properties, packet id 0, incomplete): the Python decoder takes
 * that one (and raises its error if it has to). Returns their packet ids and the position
 * after the last one. No Python code runs while the buffer is read. */
static PyObject *sp_scan_pubacks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long pos;
    const unsigned char *p;
    Py_ssize_t n;
    if (scan_src(args, nargs, 2, "scan_pubacks", "scan_pubacks(src: bytes | bytearray, pos: int)",
                 &p, &n, &pos) < 0)
        return NULL;
    Py_ssize_t i = (Py_ssize_t)pos, count = 0;
    while (i + 4 <= n && p[i] == 0x40 && p[i + 1] == 2 && (p[i + 2] | p[i + 3])) {
        i += 4;
        count++;
    }
    PyObject *ids = PyList_New(count);
    if (!ids)
        return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        const unsigned char *a = p + pos + 4 * k;
        PyObject *id = PyLong_FromLong(((long)a[2] << 8) | a[3]);
        if (!id) {
            Py_DECREF(ids);
            return NULL;
        }
        PyList_SET_ITEM(ids, k, id);
    }
    return Py_BuildValue("(Nn)", ids, i);
}

/* batch_body(payloads: list[bytes], props: list[bytes]) -> bytes
 * The MQTT broker link's store request (gateway/mqtt/broker_link.py _send): a batch body
 * (docs/protocol.md section 7.7) of one sub-message per payload, each a BATCH_HEAD (total
 * size, then zeros for magic, body CRC and flag, then the body length; big-endian int32),
 * the payload, the int16 length of its properties string and that string. One allocation,
 * no Python code. Refuses (ValueError) lists of different lengths, a properties string
 * over 32767 bytes and a body whose sizes would not fit an int32. */
static void put_be32(unsigned char *d, uint32_t v)
{
    d[0] = (unsigned char)(v >> 24);
    d[1] = (unsigned char)(v >> 16);
    d[2] = (unsigned char)(v >> 8);
    d[3] = (unsigned char)v;
}

static PyObject *sp_batch_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "batch_body(payloads: list, props: list)");
        return NULL;
    }
    PyObject *pays = args[0], *props = args[1];
    Py_ssize_t n = PyList_GET_SIZE(pays);
    if (PyList_GET_SIZE(props) != n) {
        PyErr_SetString(PyExc_ValueError, "batch_body: payloads and props differ in length");
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyList_GET_ITEM(pays, i), *b = PyList_GET_ITEM(props, i);
        if (!PyBytes_CheckExact(a) || !PyBytes_CheckExact(b)) {
            PyErr_SetString(PyExc_TypeError, "batch_body: payloads and props must be bytes");
            return NULL;
        }
        Py_ssize_t one = 22 + PyBytes_GET_SIZE(a) + PyBytes_GET_SIZE(b);
        if (PyBytes_GET_SIZE(b) > 32767 || one > INT32_MAX || total > INT32_MAX - one) {
            PyErr_SetString(PyExc_ValueError, "batch_body: a size does not fit the format");
            return NULL;
        }
        total += one;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out)
        return NULL;
    unsigned char *d = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyList_GET_ITEM(pays, i), *b = PyList_GET_ITEM(props, i);
        Py_ssize_t la = PyBytes_GET_SIZE(a), lb = PyBytes_GET_SIZE(b);
        put_be32(d, (uint32_t)(22 + la + lb));
        memset(d + 4, 0, 12);
        put_be32(d + 16, (uint32_t)la);
        memcpy(d + 20, PyBytes_AS_STRING(a), la);
        d += 20 + la;
        d[0] = (unsigned char)(lb >> 8);
        d[1] = (unsigned char)lb;
        memcpy(d + 2, PyBytes_AS_STRING(b), lb);
        d += 2 + lb;
    }
    return out;
}

/* offset_ids(ids: str, n: int) -> list[int] | None
 * The commitlog offsets of a batch's answer: `ids` is n offset msgIds joined by commas
 * (each ends with its offset as 16 hex digits). None when there are not n of them or one
 * is not hex or shorter than 16 characters: the caller then knows no offsets. */
static PyObject *sp_offset_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long want;
    if (nargs != 2 || !PyUnicode_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "offset_ids(ids: str, n: int)");
        return NULL;
    }
    if (as_i64(args[1], &want, "n") < 0)
        return NULL;
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(args[0], &len);
    if (!s)
        return NULL;
    if (want < 0 || want > len / 16 + 1)
        Py_RETURN_NONE;
    PyObject *out = PyList_New((Py_ssize_t)want);
    if (!out)
        return NULL;
    Py_ssize_t k = 0, start = 0;
    for (Py_ssize_t i = 0; i <= len; i++) {
        if (i < len && s[i] != ',')
            continue;
        if (k == want || i - start < 16)
            goto none;
        uint64_t v = 0;
        for (Py_ssize_t j = i - 16; j < i; j++) {
            char c = s[j];
            int h = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (h < 0)
                goto none;
            v = (v << 4) | (uint64_t)h;
        }
        PyObject *o = PyLong_FromUnsignedLongLong(v);
        if (!o) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k++, o);
        start = i + 1;
    }
    if (k == want)
        return out;
none:
    Py_DECREF(out);
    Py_RETURN_NONE;
}
/* ==== end s4-perf2 ==== */
/* ==== s4-ha: slave apply path (scan_chunk; core/store/ha/replica.py, docs/ha.md) ==== */
/* scan_chunk(data, phys, fpos, file_size, max_qid, multi_on, lmq_prefix, bucket_ms)
 *   -> (end, bad, last_store_ms, ops)
 * Validates the records of a replicated CommitLog chunk and plans their dispatch; the
 * Python reference (and the full contract) is speedups_py.scan_chunk. `data` is exact
 * bytes at CommitLog offset `phys`, position `fpos` of a file of `file_size` bytes
 * (fpos + len(data) <= file_size); multi_on an exact bool; lmq_prefix bytes or None;
 * bucket_ms >= 0 (0: no key-index entries). Work is linear in len(data). */
#define HA_FIXED 91
#define HA_MAGIC_V1 0xDAA320A7u
#define HA_MAGIC_V2 0xDAA320ABu
#define HA_BLANK 0xCBD43194u
#define HA_MAX_TK 1024  /* key_index._MAX_KEY_BYTES */

static inline int64_t ha_i64(const unsigned char *p)
{
    return (int64_t)(((uint64_t)get_u32(p) << 32) | get_u32(p + 4));
}

/* A key-index entry (key_index.py layout) for topic#key, appended to `entries`. */
static int ha_entry(PyObject *entries, char prefix, int64_t bucket, const unsigned char *topic,
                    Py_ssize_t tl, const unsigned char *key, Py_ssize_t kl, int64_t store_ms,
                    int64_t phys, int64_t total)
{
    Py_ssize_t tk = tl + 1 + kl;
    if (tk > HA_MAX_TK)
        return 0;
    PyObject *k = PyBytes_FromStringAndSize(NULL, 1 + 4 + 2 + tk + 16);
    PyObject *v = PyBytes_FromStringAndSize(NULL, 4);
    if (!k || !v) {
        Py_XDECREF(k);
        Py_XDECREF(v);
        return -1;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(k);
    p[0] = prefix;
    put_u32(p + 1, (uint32_t)bucket);
    put_u16(p + 5, (uint32_t)tk);
    memcpy(p + 7, topic, tl);
    p[7 + tl] = '#';
    memcpy(p + 8 + tl, key, kl);
    put_u64(p + 7 + tk, (uint64_t)store_ms);
    put_u64(p + 15 + tk, (uint64_t)phys);
    put_u32((unsigned char *)PyBytes_AS_STRING(v), (uint32_t)total);
    PyObject *pair = PyTuple_Pack(2, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
    if (!pair)
        return -1;
    int r = PyList_Append(entries, pair);
    Py_DECREF(pair);
    return r;
}

#define HA_MAX_TARGETS 64  /* more multi-dispatch names: the general dispatch */

/* 1 when every multi-dispatch target is an LMQ: names start with `lp`, distinct, none the
 * topic; offsets plain decimal (1-18 digits) within `bound`; as many as names. */
static int ha_lmq_check(const unsigned char *md, Py_ssize_t mdl, const unsigned char *mo,
                        Py_ssize_t mol, const unsigned char *topic, Py_ssize_t tl,
                        const unsigned char *lp, Py_ssize_t ll, long long bound)
{
    const unsigned char *ns[HA_MAX_TARGETS];
    Py_ssize_t nl[HA_MAX_TARGETS];
    int n = 0, k = 0;
    Py_ssize_t s = 0;
    if (!lp)
        return 0;
    for (;;) {
        const unsigned char *c = memchr(md + s, ',', mdl - s);
        Py_ssize_t e = c ? c - md : mdl;
        if (n == HA_MAX_TARGETS)
            return 0;
        ns[n] = md + s;
        nl[n++] = e - s;
        if (!c)
            break;
        s = e + 1;
    }
    s = 0;
    for (;;) {
        const unsigned char *c = memchr(mo + s, ',', mol - s);
        Py_ssize_t e = c ? c - mo : mol;
        if (k == n || e - s < 1 || e - s > 18)
            return 0;
        long long v = 0;
        for (Py_ssize_t i = s; i < e; i++) {
            if (mo[i] < '0' || mo[i] > '9')
                return 0;
            v = v * 10 + (mo[i] - '0');
        }
        if (v > bound)
            return 0;
        k++;
        if (!c)
            break;
        s = e + 1;
    }
    if (k != n)
        return 0;
    for (int i = 0; i < n; i++) {
        if (nl[i] < ll || memcmp(ns[i], lp, ll) != 0
            || (nl[i] == tl && memcmp(ns[i], topic, tl) == 0))
            return 0;
        for (int j = 0; j < i; j++)
            if (nl[j] == nl[i] && memcmp(ns[j], ns[i], nl[i]) == 0)
                return 0;
    }
    return 1;
}

/* The (name, offset, LMQ unit) targets of a record ha_lmq_check accepted, into `out`. */
static int ha_lmq_add(PyObject *out, const unsigned char *md, Py_ssize_t mdl,
                      const unsigned char *mo, Py_ssize_t mol, long long phys, long long total,
                      long long tc, long long store_ms)
{
    PyObject *unit = PyBytes_FromStringAndSize(NULL, 28);
    if (!unit)
        return -1;
    unsigned char *u = (unsigned char *)PyBytes_AS_STRING(unit);
    put_u64(u, (uint64_t)phys);
    put_u32(u + 8, (uint32_t)total);
    put_u64(u + 12, (uint64_t)tc);
    put_u64(u + 20, (uint64_t)store_ms);
    Py_ssize_t s = 0, t = 0;
    int r = 0;
    for (;;) {
        const unsigned char *c = memchr(md + s, ',', mdl - s);
        const unsigned char *d = memchr(mo + t, ',', mol - t);
        Py_ssize_t e = c ? c - md : mdl, f = d ? d - mo : mol;
        long long v = 0;
        for (Py_ssize_t i = t; i < f; i++)
            v = v * 10 + (mo[i] - '0');
        PyObject *item = Py_BuildValue("(s#LO)", (const char *)md + s, e - s, v, unit);
        if (!item || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            r = -1;
            break;
        }
        Py_DECREF(item);
        if (!c)
            break;
        s = e + 1;
        t = f + 1;
    }
    Py_DECREF(unit);
    return r;
}

static int ha_ascii(const unsigned char *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] & 0x80)
            return 0;
    return 1;
}

static PyObject *sp_scan_chunk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "scan_chunk takes 8 arguments");
        return NULL;
    }
    long long phys, fpos, fsz, max_qid, bucket_ms;
    if (!PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "data must be bytes");
        return NULL;
    }
    if (as_i64(args[1], &phys, "phys") < 0 || as_i64(args[2], &fpos, "fpos") < 0
        || as_i64(args[3], &fsz, "file_size") < 0 || as_i64(args[4], &max_qid, "max_qid") < 0
        || as_i64(args[7], &bucket_ms, "bucket_ms") < 0)
        return NULL;
    if (!PyBool_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "multi_on must be a bool");
        return NULL;
    }
    if (args[6] != Py_None && !PyBytes_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "lmq_prefix must be bytes or None");
        return NULL;
    }
    const int multi_on = args[5] == Py_True;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    const Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (phys < 0 || fpos < 0 || fsz <= 0 || max_qid < 0 || bucket_ms < 0
        || fpos > fsz || n > fsz - fpos || phys > INT64_MAX - fsz) {
        PyErr_SetString(PyExc_ValueError, "scan_chunk: bad offsets");
        return NULL;
    }
    const unsigned char *lp = NULL;
    Py_ssize_t ll = 0;
    if (args[6] != Py_None) {
        lp = (const unsigned char *)PyBytes_AS_STRING(args[6]);
        ll = PyBytes_GET_SIZE(args[6]);
    }
    PyObject *ops = PyList_New(0);
    PyObject *runs = PyDict_New();
    if (!ops || !runs)
        goto fail;
    /* The run the previous record went to (borrowed: `runs` or `ops` holds it). */
    PyObject *last = NULL;
    const unsigned char *last_topic = NULL;
    Py_ssize_t last_tl = 0;
    long long last_qid = 0, last_next = 0;
    long long last_ms = -1;
    int bad = 0;
    Py_ssize_t p = 0;
    while (p < n) {
        long long at = fpos + p;
        if (at + 8 > fsz) {
            p = n;
            break;
        }
        if (p + 8 > n) {
            bad = 1;
            break;
        }
        int32_t total = (int32_t)get_u32(d + p);
        uint32_t magic = get_u32(d + p + 4);
        if (magic == HA_BLANK && (long long)total == fsz - at) {
            p = (Py_ssize_t)(fsz - fpos);
            break;
        }
        if ((magic != HA_MAGIC_V1 && magic != HA_MAGIC_V2) || total < HA_FIXED
            || total > n - p || at + total + 8 > fsz || ha_i64(d + p + 28) != phys + p) {
            bad = 1;
            break;
        }
        /* Layout (core.common.codec.parse_layout) and body CRC. */
        const unsigned char *r = d + p;
        const Py_ssize_t end = total;
        int32_t sys_flag = (int32_t)get_u32(r + 36);
        Py_ssize_t born = (sys_flag & (1 << 4)) ? 20 : 8;
        Py_ssize_t stored = (sys_flag & (1 << 5)) ? 20 : 8;
        if (total < HA_FIXED + born - 8 + stored - 8) {
            bad = 1;
            break;
        }
        Py_ssize_t ts = 48 + born;
        Py_ssize_t q = ts + 8 + stored + 12;
        int32_t blen = (int32_t)get_u32(r + q);
        Py_ssize_t body = q + 4;
        if (blen < 0 || blen > end - body) {
            bad = 1;
            break;
        }
        q = body + blen;
        Py_ssize_t tl;
        if (magic == HA_MAGIC_V1) {
            if (q + 1 > end) {
                bad = 1;
                break;
            }
            tl = r[q];
            q += 1;
        } else {
            if (q + 2 > end) {
                bad = 1;
                break;
            }
            tl = (int16_t)((r[q] << 8) | r[q + 1]);
            q += 2;
        }
        if (tl < 0 || q + tl + 2 > end) {
            bad = 1;
            break;
        }
        const unsigned char *topic = r + q;
        q += tl;
        Py_ssize_t pl = (int16_t)((r[q] << 8) | r[q + 1]);
        const unsigned char *props = r + q + 2;
        if (pl < 0 || q + 2 + pl != end
            || (crc32_buf(r + body, blen) & 0x7FFFFFFFu) != get_u32(r + 8)) {
            bad = 1;
            break;
        }
        long long qid = (int32_t)get_u32(r + 12);
        long long qoff = ha_i64(r + 20);
        long long store_ms = ha_i64(r + ts);
        if (qid < 0 || qid >= max_qid || qoff < 0 || qoff > (phys + p) / HA_FIXED
            || store_ms < 0 || (bucket_ms > 0 && store_ms / bucket_ms > INT32_MAX)) {
            bad = 1;
            break;
        }
        last_ms = store_ms;
        long long rphys = phys + p;
        const unsigned char *tags = NULL, *keys = NULL, *uniq = NULL, *md = NULL, *mo = NULL;
        Py_ssize_t tagl = 0, keyl = 0, uniql = 0, mdl = 0, mol = 0;
        int general = !ha_ascii(topic, tl) || !ha_ascii(props, pl)
            || (lp && tl >= ll && memcmp(topic, lp, ll) == 0);
        int targets = 0;
        if (!general && multi_on
            && last_value(props, pl, "INNER_MULTI_DISPATCH", 20, &md, &mdl)
            && last_value(props, pl, "INNER_MULTI_QUEUE_OFFSET", 24, &mo, &mol)) {
            targets = ha_lmq_check(md, mdl, mo, mol, topic, tl, lp, ll, rphys / HA_FIXED);
            general = !targets;
        }
        if (general) {
            PyDict_Clear(runs);
            last = NULL;
            PyObject *o = PyLong_FromLongLong(rphys);
            if (!o || PyList_Append(ops, o) < 0) {
                Py_XDECREF(o);
                goto fail;
            }
            Py_DECREF(o);
            p += total;
            continue;
        }
        PyObject *run = NULL;
        if (last && last_qid == qid && last_tl == tl && last_next == qoff
            && memcmp(last_topic, topic, tl) == 0) {
            run = last;
        } else {
            PyObject *key = Py_BuildValue("(y#L)", (const char *)topic, tl, qid);
            if (!key)
                goto fail;
            run = PyDict_GetItemWithError(runs, key);
            if (run) {
                Py_ssize_t have = PyByteArray_GET_SIZE(PyList_GET_ITEM(run, 3)) / 20;
                if (PyLong_AsLongLong(PyList_GET_ITEM(run, 2)) + have != qoff)
                    run = NULL;
            } else if (PyErr_Occurred()) {
                Py_DECREF(key);
                goto fail;
            }
            if (!run) {
                run = Py_BuildValue("[OOLNNN]", PyTuple_GET_ITEM(key, 0),
                                    PyTuple_GET_ITEM(key, 1), qoff,
                                    PyByteArray_FromStringAndSize(NULL, 0), PyList_New(0),
                                    PyList_New(0));
                if (!run || PyDict_SetItem(runs, key, run) < 0 || PyList_Append(ops, run) < 0) {
                    Py_XDECREF(run);
                    Py_DECREF(key);
                    goto fail;
                }
                Py_DECREF(run);  /* `runs` and `ops` hold it */
            }
            Py_DECREF(key);
            last = run;
            last_topic = topic;
            last_tl = tl;
            last_qid = qid;
        }
        last_next = qoff + 1;
        PyObject *units = PyList_GET_ITEM(run, 3);
        Py_ssize_t un = PyByteArray_GET_SIZE(units);
        if (PyByteArray_Resize(units, un + 20) < 0)
            goto fail;
        unsigned char *u = (unsigned char *)PyByteArray_AS_STRING(units) + un;
        long long tc = last_value(props, pl, "TAGS", 4, &tags, &tagl)
            ? java_hash_ascii(tags, tagl) : 0;
        put_u64(u, (uint64_t)rphys);
        put_u32(u + 8, (uint32_t)total);
        put_u64(u + 12, (uint64_t)tc);
        if (targets && ha_lmq_add(PyList_GET_ITEM(run, 5), md, mdl, mo, mol, rphys, total, tc,
                                  store_ms) < 0)
            goto fail;
        if (bucket_ms > 0) {
            PyObject *entries = PyList_GET_ITEM(run, 4);
            int64_t bucket = store_ms / bucket_ms;
            if (last_value(props, pl, "KEYS", 4, &keys, &keyl)) {
                Py_ssize_t s = 0;
                while (s <= keyl) {
                    const unsigned char *sp = memchr(keys + s, ' ', keyl - s);
                    Py_ssize_t e = sp ? sp - keys : keyl;
                    if (e > s && ha_entry(entries, 'k', bucket, topic, tl, keys + s, e - s,
                                          store_ms, rphys, total) < 0)
                        goto fail;
                    if (!sp)
                        break;
                    s = e + 1;
                }
            }
            if (last_value(props, pl, "UNIQ_KEY", 8, &uniq, &uniql)
                && ha_entry(entries, 'q', bucket, topic, tl, uniq, uniql, store_ms, rphys,
                            total) < 0)
                goto fail;
        }
        p += total;
    }
    Py_DECREF(runs);
    return Py_BuildValue("(nOLN)", p, bad ? Py_True : Py_False, last_ms, ops);
fail:
    Py_XDECREF(ops);
    Py_XDECREF(runs);
    return NULL;
}
/* ==== end s4-ha ==== */

/* ==== s6-fanout: an LMQ's recent records as mapped slices, one call per read ============
 * recent_slices(chain, offset, max_count, max_bytes, files, file_size, first_no, clmin,
 * wrote) -> (list[memoryview], bytes): what the unit-by-unit read (before recent_chain) and the loop of
 * ReadPath.recent_records give, in one pass and without a tuple per unit. `chain` holds
 * LmqIndex unit lists (oldest first), each [offset, unit, offset, unit, ...] with a unit's
 * first 12 octets = phys int64 | size int32 (big-endian); `files` are the CommitLog's
 * MappedFiles (their `view` is sliced). Records of consecutive offsets from `offset`, at
 * most `max_count`; stops at the first offset not in the chain, at the first unit whose
 * record is gone (below `clmin`, past `wrote`, outside its file), or before passing
 * `max_bytes` (the first record is always taken). No Python code runs but the slicing of
 * a memoryview and reading a MappedFile's slot; every size is read again after it. */
static PyObject *S_VIEW;

static PyObject *sp_recent_slices(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long want, max_count, max_bytes, fs, first_no, clmin, wrote;
    if (nargs != 9 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "recent_slices(chain: list, offset, max_count, max_bytes, files: list, "
                        "file_size, first_no, clmin, wrote)");
        return NULL;
    }
    if (as_i64(args[1], &want, "offset") < 0 || as_i64(args[2], &max_count, "max_count") < 0 ||
        as_i64(args[3], &max_bytes, "max_bytes") < 0 || as_i64(args[5], &fs, "file_size") < 0 ||
        as_i64(args[6], &first_no, "first_no") < 0 || as_i64(args[7], &clmin, "clmin") < 0 ||
        as_i64(args[8], &wrote, "wrote") < 0)
        return NULL;
    if (fs <= 0 || clmin < 0) {
        PyErr_SetString(PyExc_ValueError, "recent_slices: file_size must be > 0, clmin >= 0");
        return NULL;
    }
    PyObject *chain = args[0], *files = args[4];
    PyObject *out = PyList_New(0), *units = NULL, *view = NULL;
    if (!out)
        return NULL;
    long long total = 0, cur = -1;
    for (Py_ssize_t g = 0; g < PyList_GET_SIZE(chain); g++) {
        if (PyList_GET_SIZE(out) >= max_count)
            break;
        units = PyList_GET_ITEM(chain, g);
        if (!PyList_CheckExact(units)) {
            units = NULL;
            PyErr_SetString(PyExc_TypeError, "recent_slices: the chain holds lists");
            goto fail;
        }
        Py_INCREF(units);
        long long first;
        if (PyList_GET_SIZE(units) < 2 ||
            as_i64(PyList_GET_ITEM(units, 0), &first, "unit offset") < 0) {
            if (PyErr_Occurred())
                goto fail;
            Py_CLEAR(units);
            continue;
        }
        long long d = want - first;
        if (d < 0 || d >= PyList_GET_SIZE(units) / 2) {
            Py_CLEAR(units);
            continue;
        }
        for (Py_ssize_t i = (Py_ssize_t)(d * 2); i + 1 < PyList_GET_SIZE(units); i += 2) {
            if (PyList_GET_SIZE(out) >= max_count)
                break;
            long long off;
            if (as_i64(PyList_GET_ITEM(units, i), &off, "unit offset") < 0)
                goto fail;
            if (off != want)
                break;
            PyObject *u = PyList_GET_ITEM(units, i + 1);
            if (!PyBytes_CheckExact(u) || PyBytes_GET_SIZE(u) < 12) {
                PyErr_SetString(PyExc_TypeError, "recent_slices: a unit is bytes of >= 12");
                goto fail;
            }
            const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(u);
            long long phys = (long long)(((uint64_t)get_u32(p) << 32) | get_u32(p + 4));
            long long size = (int32_t)get_u32(p + 8);
            if (phys < clmin || size <= 0 || phys > wrote - size)
                goto done;  /* gone (retention) or not written: `get` says what to do */
            if (PyList_GET_SIZE(out) && total + size > max_bytes)
                goto done;
            long long fi = phys / fs - first_no, pos = phys % fs;
            if (fi < 0 || fi >= PyList_GET_SIZE(files) || pos + size > fs)
                goto done;
            if (fi != cur) {
                Py_CLEAR(view);
                PyObject *mf = PyList_GET_ITEM(files, (Py_ssize_t)fi);
                Py_INCREF(mf);
                view = PyObject_GetAttr(mf, S_VIEW);
                Py_DECREF(mf);
                if (!view)
                    goto fail;
                cur = fi;
            }
            PyObject *buf = PySequence_GetSlice(view, (Py_ssize_t)pos, (Py_ssize_t)(pos + size));
            if (!buf)
                goto fail;
            int rc = PyList_Append(out, buf);
            Py_DECREF(buf);
            if (rc < 0)
                goto fail;
            total += size;
            want++;
        }
        Py_CLEAR(units);
    }
done:
    Py_XDECREF(units);
    Py_XDECREF(view);
    PyObject *total_obj = PyLong_FromLongLong(total);
    if (!total_obj) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *ret = PyTuple_Pack(2, out, total_obj);
    Py_DECREF(out);
    Py_DECREF(total_obj);
    return ret;
fail:
    Py_XDECREF(units);
    Py_XDECREF(view);
    Py_DECREF(out);
    return NULL;
}
/* batch_props_have(body, needle) -> int: 1 when the properties of some sub-message of a
 * batch body (docs/protocol.md §7.7: size int32, magic, crc, flag, body length int32, body,
 * properties length int16, properties) contain `needle`, 0 when none does, -1 when the
 * body is malformed (its split says what is wrong). Searches only the properties, not the
 * bodies (a send batch checks its messages for DELAY this way). */
static int props_contain(const unsigned char *p, Py_ssize_t n, const unsigned char *nd,
                         Py_ssize_t nl)
{
    if (nl == 0)
        return 1;
    while (n >= nl) {
        const unsigned char *q = memchr(p, nd[0], (size_t)(n - nl + 1));
        if (!q)
            return 0;
        if (memcmp(q, nd, (size_t)nl) == 0)
            return 1;
        n -= q + 1 - p;
        p = q + 1;
    }
    return 0;
}

static PyObject *sp_batch_props_have(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "batch_props_have(body: bytes, needle: bytes)");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    const unsigned char *nd = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]), nl = PyBytes_GET_SIZE(args[1]), pos = 0;
    int found = 0;
    while (pos < n) {
        if (n - pos < 20)
            return PyLong_FromLong(-1);
        int32_t size = (int32_t)get_u32(b + pos), blen = (int32_t)get_u32(b + pos + 16);
        if (blen < 0 || size < 22 || size - 22 < blen || size > n - pos)
            return PyLong_FromLong(-1);
        Py_ssize_t p0 = pos + 20 + blen;
        int16_t plen = (int16_t)((b[p0] << 8) | b[p0 + 1]);
        p0 += 2;
        if (plen < 0 || p0 + plen != pos + size)
            return PyLong_FromLong(-1);
        if (!found && props_contain(b + p0, plen, nd, nl))
            found = 1;  /* the rest is still checked: a malformed body is not let through */
        pos += size;
    }
    return PyLong_FromLong(found);
}
/* ==== end s6-fanout ==== */

/* ==== s6-amqpub: a read's run of AMQP basic.publish triples in one call ===============
 * scan_amqp_publishes(buf, pos, limit, max_message_size, pending, memo, content, publish)
 *   -> (run, pos)
 * gateway/amqp/publish_scan.py has the contract and scan_publishes_py, the Python
 * reference (tests compare the two on random and mutated streams). Consecutive publishes
 * (method frame, content header, at most one body frame, all complete) become `content`
 * tuples (channel, `publish`(ticket, exchange, routing_key, mandatory, immediate),
 * properties, raw properties, body); the first frame that is anything else, or whose
 * properties are not a key of `memo`, ends the run and is left to the Python decoder.
 * `content` and `publish` must be tuple subclasses (namedtuples): they are filled as
 * tuple.__new__ would, without calling their Python __new__. */
static int amqp_tuple_type(PyObject *o)
{
    return PyType_Check(o) && PyType_IsSubtype((PyTypeObject *)o, &PyTuple_Type) &&
           ((PyTypeObject *)o)->tp_alloc != NULL;
}

static PyObject *amqp_tuple(PyObject *type, Py_ssize_t n, PyObject **items)
{
    /* Steals the references in items (all non-NULL), also on failure. */
    PyObject *t = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (t)
            PyTuple_SET_ITEM(t, i, items[i]);
        else
            Py_DECREF(items[i]);
    }
    return t;
}

static long long amqp_frame(const unsigned char *p, Py_ssize_t n, Py_ssize_t at,
                            unsigned kind, unsigned channel, long long limit)
{
    /* The payload size of a complete frame of `kind` on `channel` at `at` (its end octet
     * there and 0xCE, its payload at most `limit` octets), else -1. */
    if (n - at < 7 || p[at] != kind || (((unsigned)p[at + 1] << 8) | p[at + 2]) != channel)
        return -1;
    long long size = ((long long)p[at + 3] << 24) | ((long long)p[at + 4] << 16) |
                     ((long long)p[at + 5] << 8) | p[at + 6];
    if (size > limit || size >= n - at - 7 || p[at + 7 + size] != 0xCE)
        return -1;
    return size;
}

static PyObject *amqp_shortstr(const unsigned char *p, Py_ssize_t n, PyObject **prev,
                               const unsigned char **prev_p, Py_ssize_t *prev_n)
{
    /* A new reference to the decoded short string; the previous one again when its octets
     * repeat (*prev is borrowed from the run being built). */
    if (*prev && n == *prev_n && memcmp(p, *prev_p, n) == 0)
        return Py_NewRef(*prev);
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "surrogateescape");
    if (s) {
        *prev = s;
        *prev_p = p;
        *prev_n = n;
    }
    return s;
}

static PyObject *sp_scan_amqp_publishes(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs)
{
    long long pos, limit, max_size;
    const unsigned char *p;
    Py_ssize_t n;
    if (scan_src(args, nargs, 8, "scan_amqp_publishes",
                 "scan_amqp_publishes(buf: bytes | bytearray, pos: int, limit: int, "
                 "max_message_size: int, pending: dict, memo: dict, content: type, "
                 "publish: type)", &p, &n, &pos) < 0 ||
        as_i64(args[2], &limit, "limit") < 0 ||
        as_i64(args[3], &max_size, "max message size") < 0)
        return NULL;
    PyObject *pending = args[4], *memo = args[5], *content = args[6], *publish = args[7];
    if (!PyDict_CheckExact(pending) || !PyDict_CheckExact(memo) ||
        !amqp_tuple_type(content) || !amqp_tuple_type(publish)) {
        PyErr_SetString(PyExc_TypeError, "scan_amqp_publishes: pending and memo must be "
                        "dicts, content and publish tuple subclasses");
        return NULL;
    }
    PyObject *run = PyList_New(0), *ret = NULL;
    if (!run)
        return NULL;
    /* The previous message's strings and properties (borrowed from `run`). */
    PyObject *px = NULL, *pk = NULL, *praw = NULL, *pprops = NULL;
    const unsigned char *px_p = NULL, *pk_p = NULL;
    Py_ssize_t px_n = 0, pk_n = 0;
    while (n - pos >= 7) {
        Py_ssize_t at = (Py_ssize_t)pos;
        unsigned channel = ((unsigned)p[at + 1] << 8) | p[at + 2];
        long long size = channel ? amqp_frame(p, n, at, 1, channel, limit) : -1;
        if (size < 9 || memcmp(p + at + 7, "\x00\x3c\x00\x28", 4) != 0)
            break;
        Py_ssize_t stop = at + 7 + (Py_ssize_t)size, h = stop + 1;  /* the content header */
        long long hsize = amqp_frame(p, n, h, 2, channel, limit);
        if (hsize < 14)
            break;
        Py_ssize_t hstop = h + 7 + (Py_ssize_t)hsize;
        unsigned class_id = ((unsigned)p[h + 7] << 8) | p[h + 8];
        unsigned long long body_size = 0;
        for (int i = 0; i < 8; i++)
            body_size = (body_size << 8) | p[h + 11 + i];
        if (class_id != 60 || body_size > (unsigned long long)max_size)
            break;
        Py_ssize_t after = hstop + 1, b0 = 0;
        if (body_size) {
            long long bsize = amqp_frame(p, n, after, 3, channel, limit);  /* the body */
            if (bsize < 0 || (unsigned long long)bsize != body_size)
                break;
            b0 = after + 7;
            after = b0 + (Py_ssize_t)bsize + 1;
        }
        /* ticket:uint16 exchange:shortstr routing_key:shortstr bits:octet, nothing more */
        Py_ssize_t m = at + 7, x0 = m + 7, x1 = x0 + p[m + 6];
        if (x1 >= stop)
            break;
        Py_ssize_t k0 = x1 + 1, k1 = k0 + p[x1];
        if (k1 + 1 != stop)
            break;
        PyObject *ch_obj = PyLong_FromUnsignedLong(channel);
        if (!ch_obj)
            goto fail;
        int busy = PyDict_Contains(pending, ch_obj);  /* a content under way there */
        if (busy != 0) {
            Py_DECREF(ch_obj);
            if (busy < 0)
                goto fail;
            break;
        }
        Py_ssize_t rn = hstop - (h + 19);
        PyObject *raw, *props;
        if (praw && rn == PyBytes_GET_SIZE(praw) &&
            memcmp(PyBytes_AS_STRING(praw), p + h + 19, rn) == 0) {
            raw = Py_NewRef(praw);
            props = Py_NewRef(pprops);
        } else {
            raw = PyBytes_FromStringAndSize((const char *)p + h + 19, rn);
            if (!raw) {
                Py_DECREF(ch_obj);
                goto fail;
            }
            props = PyDict_GetItemWithError(memo, raw);
            if (!props) {
                Py_DECREF(raw);
                Py_DECREF(ch_obj);
                if (PyErr_Occurred())
                    goto fail;
                break;  /* not decoded yet: the Python decoder does it (and fills memo) */
            }
            Py_INCREF(props);
        }
        PyObject *fields[5];
        fields[0] = PyLong_FromLong(((long)p[m + 4] << 8) | p[m + 5]);
        fields[1] = amqp_shortstr(p + x0, x1 - x0, &px, &px_p, &px_n);
        fields[2] = amqp_shortstr(p + k0, k1 - k0, &pk, &pk_p, &pk_n);
        fields[3] = PyBool_FromLong(p[k1] & 1);
        fields[4] = PyBool_FromLong(p[k1] & 2);
        PyObject *body = body_size
            ? PyBytes_FromStringAndSize((const char *)p + b0, (Py_ssize_t)body_size)
            : PyBytes_FromStringAndSize(NULL, 0);
        if (!fields[0] || !fields[1] || !fields[2] || !body) {
            for (int i = 0; i < 5; i++)
                Py_XDECREF(fields[i]);
            Py_XDECREF(body);
            Py_DECREF(raw);
            Py_DECREF(props);
            Py_DECREF(ch_obj);
            goto fail;
        }
        PyObject *method = amqp_tuple(publish, 5, fields);
        if (!method) {
            Py_DECREF(body);
            Py_DECREF(raw);
            Py_DECREF(props);
            Py_DECREF(ch_obj);
            goto fail;
        }
        PyObject *items[5] = {ch_obj, method, props, raw, body};
        PyObject *event = amqp_tuple(content, 5, items);
        if (!event)
            goto fail;
        praw = raw;  /* borrowed from `event`, which `run` holds once appended */
        pprops = props;
        pos = after;
        int appended = PyList_Append(run, event);
        Py_DECREF(event);
        if (appended < 0)
            goto fail;
    }
    ret = Py_BuildValue("(OL)", run, pos);
fail:
    Py_DECREF(run);
    return ret;
}
/* ==== end s6-amqpub ==== */

/* ------------------------------------------------------------------ module */
static PyMethodDef methods[] = {
    {"crc32", sp_crc32, METH_O, "crc32(data) -> int: zlib's CRC-32 of a bytes-like object."},
    {"encode_props", (PyCFunction)(void (*)(void))sp_encode_props, METH_FASTCALL,
     "encode_props(props, offsets) -> bytes: the stored properties string."},
    {"write_record", (PyCFunction)(void (*)(void))sp_write_record, METH_FASTCALL,
     "write_record(mm, pos, total, ...): pack one record into a writable buffer."},
    {"plan_lmqs", (PyCFunction)(void (*)(void))sp_plan_lmqs, METH_FASTCALL,
     "plan_lmqs(names, cache, topic, bump) -> (offsets, targets, new) | None: a usual LMQ plan."},
    {"stage_units", (PyCFunction)(void (*)(void))sp_stage_units, METH_FASTCALL,
     "stage_units(staged, cache, targets, unit) -> int: stage LMQ units; new LMQ count."},
    {"write_units", (PyCFunction)(void (*)(void))sp_write_units, METH_FASTCALL,
     "write_units(snapshot, put, prefixes) -> int: staged LMQ units into a write batch."},
    {"split_batch", (PyCFunction)(void (*)(void))sp_split_batch, METH_FASTCALL,
     "split_batch(body, extra, ...) -> items | (status, remark) | None: batch pass 1."},
    {"write_batch", (PyCFunction)(void (*)(void))sp_write_batch, METH_FASTCALL,
     "write_batch(mm, pos, limit, items, i, ...) -> (i, pos): batch pass 2."},
    /* ==== s4-perf ==== */
    {"plan_batch_lmqs", (PyCFunction)(void (*)(void))sp_plan_batch_lmqs, METH_FASTCALL,
     "plan_batch_lmqs(items, memo, cache, topic, ...) -> (names, bases, first) | refusal | None."},
    {"stage_batch_lmqs", (PyCFunction)(void (*)(void))sp_stage_batch_lmqs, METH_FASTCALL,
     "stage_batch_lmqs(staged, cache, names, bases, cq_units, store_ms) -> int: LMQ units."},
    {"scan_publishes", (PyCFunction)(void (*)(void))sp_scan_publishes, METH_FASTCALL,
     "scan_publishes(src, pos, max_packet_size) -> (run, pos): 3.x PUBLISHes decoded."},
    /* ==== end s4-perf ==== */
    /* ==== s4-perf2 ==== */
    {"scan_pubacks", (PyCFunction)(void (*)(void))sp_scan_pubacks, METH_FASTCALL,
     "scan_pubacks(src, pos) -> (packet_ids, pos): a run of 4-byte PUBACKs."},
    {"batch_body", (PyCFunction)(void (*)(void))sp_batch_body, METH_FASTCALL,
     "batch_body(payloads, props) -> bytes: the MQTT broker link's batch body."},
    {"offset_ids", (PyCFunction)(void (*)(void))sp_offset_ids, METH_FASTCALL,
     "offset_ids(ids, n) -> list[int] | None: the offsets of n joined offset msgIds."},
    /* ==== end s4-perf2 ==== */
    /* s4-ha */
    {"scan_chunk", (PyCFunction)(void (*)(void))sp_scan_chunk, METH_FASTCALL,
     "scan_chunk(data, phys, fpos, ...) -> (end, bad, last ms, ops): a replicated chunk."},
    /* ==== s6-fanout ==== */
    {"recent_slices", (PyCFunction)(void (*)(void))sp_recent_slices, METH_FASTCALL,
     "recent_slices(chain, offset, max_count, ...) -> (slices, bytes): an LMQ's recent records."},
    {"batch_props_have", (PyCFunction)(void (*)(void))sp_batch_props_have, METH_FASTCALL,
     "batch_props_have(body, needle) -> 1 | 0 | -1: needle in a batch's properties."},
    /* ==== end s6-fanout ==== */
    /* ==== s6-amqpub ==== */
    {"scan_amqp_publishes", (PyCFunction)(void (*)(void))sp_scan_amqp_publishes, METH_FASTCALL,
     "scan_amqp_publishes(buf, pos, limit, max_message_size, pending, memo, content, "
     "publish) -> (run, pos): a run of AMQP basic.publish triples decoded."},
    /* ==== end s6-amqpub ==== */
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "core._speedups",
    "The store's per-message byte work in C (see core/store/speedups.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    crc_init();
    PyObject *mmap_mod = PyImport_ImportModule("mmap");
    if (!mmap_mod)
        return NULL;
    mmap_type = PyObject_GetAttrString(mmap_mod, "mmap");
    Py_DECREF(mmap_mod);
    if (!mmap_type)
        return NULL;
    S_WAIT = PyUnicode_InternFromString("WAIT");
    S_MULTI_OFFSETS = PyUnicode_InternFromString("INNER_MULTI_QUEUE_OFFSET");
    if (!S_WAIT || !S_MULTI_OFFSETS)
        return NULL;
    S_VIEW = PyUnicode_InternFromString("view");  /* s6-fanout */
    if (!S_VIEW)
        return NULL;
    return PyModule_Create(&moddef);
}
