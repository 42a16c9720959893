/* core._speedups: the per-message byte work of the store's put paths, in C.
 *
 * The store (core/store/put_path.py, put_batch.py, lmq_index.py) plans every message in
 * Python -- validation, queue offsets, LMQ offsets, file rolls -- and hands the byte work
 * to these functions: encoding a properties dict, packing a CommitLog record straight into
 * the mapping, staging LMQ units, building the RocksDB keys of staged units, and splitting
 * a batch send body. core/store/speedups.py holds the same functions in Python (the
 * reference, and the fallback where this module was not built); tests check that both
 * give the same bytes.
 *
 * Formats: protocol doc section 7.1 (record), 7.7 (batch body); kv.py (LMQ unit keys).
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

static int as_i64(PyObject *o, long long *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static int as_i32(PyObject *o, long long *out, const char *what)
{
    if (as_i64(o, out) < 0)
        return -1;
    if (*out < INT32_MIN || *out > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s out of int32 range", what);
        return -1;
    }
    return 0;
}

static PyObject *S_WAIT, *S_MULTI_OFFSETS;
static const char OFFSETS_PAIR[] = "\x02INNER_MULTI_QUEUE_OFFSET\x01";
#define OFFSETS_PAIR_LEN (sizeof(OFFSETS_PAIR) - 1)

/* ------------------------------------------------------------------ crc32 */
static PyObject *sp_crc32(PyObject *self, PyObject *arg)
{
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t c = crc32_buf(b.buf, b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* ------------------------------------------------------------------ encode_props
 * encode_props(props: dict[str, str], offsets: list[int] | None) -> bytes
 * "\x02".join(k + "\x01" + v for k, v in props.items()) in UTF-8. With offsets: WAIT and
 * INNER_MULTI_QUEUE_OFFSET pairs are left out and "\x02INNER_MULTI_QUEUE_OFFSET\x01" plus
 * the offsets joined by "," is appended. A non-str key or value is a TypeError, a lone
 * surrogate a UnicodeEncodeError (as str.join/str.encode raise them). */
static PyObject *sp_encode_props(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "encode_props(props, offsets)");
        return NULL;
    }
    PyObject *props = args[0], *offsets = args[1];
    if (!PyDict_Check(props)) {
        PyErr_SetString(PyExc_TypeError, "properties must be a dict");
        return NULL;
    }
    int multi = offsets != Py_None;
    if (multi && !PyList_Check(offsets)) {
        PyErr_SetString(PyExc_TypeError, "offsets must be a list");
        return NULL;
    }
    /* Pass 1: sizes (and the UTF-8 of every string, cached by CPython for non-ASCII). */
    Py_ssize_t pos = 0, total = 0, npairs = 0;
    PyObject *k, *v;
    while (PyDict_Next(props, &pos, &k, &v)) {
        if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "property names and values must be str");
            return NULL;
        }
        if (multi && (PyUnicode_Compare(k, S_WAIT) == 0 || PyUnicode_Compare(k, S_MULTI_OFFSETS) == 0))
            continue;
        Py_ssize_t kl, vl;
        if (!PyUnicode_AsUTF8AndSize(k, &kl) || !PyUnicode_AsUTF8AndSize(v, &vl))
            return NULL;
        total += kl + vl + 1 + (npairs ? 1 : 0);
        npairs++;
    }
    char digits[32];
    Py_ssize_t noff = 0;
    if (multi) {
        noff = PyList_GET_SIZE(offsets);
        total += OFFSETS_PAIR_LEN;
        for (Py_ssize_t i = 0; i < noff; i++) {
            long long o;
            if (as_i64(PyList_GET_ITEM(offsets, i), &o) < 0)
                return NULL;
            total += snprintf(digits, sizeof digits, "%lld", o) + (i ? 1 : 0);
        }
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out)
        return NULL;
    char *w = PyBytes_AS_STRING(out);
    pos = 0;
    npairs = 0;
    while (PyDict_Next(props, &pos, &k, &v)) {
        if (multi && (PyUnicode_Compare(k, S_WAIT) == 0 || PyUnicode_Compare(k, S_MULTI_OFFSETS) == 0))
            continue;
        Py_ssize_t kl, vl;
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kl);
        const char *vs = PyUnicode_AsUTF8AndSize(v, &vl);
        if (npairs++)
            *w++ = '\x02';
        memcpy(w, ks, kl);
        w += kl;
        *w++ = '\x01';
        memcpy(w, vs, vl);
        w += vl;
    }
    if (multi) {
        memcpy(w, OFFSETS_PAIR, OFFSETS_PAIR_LEN);
        w += OFFSETS_PAIR_LEN;
        for (Py_ssize_t i = 0; i < noff; i++) {
            long long o = PyLong_AsLongLong(PyList_GET_ITEM(offsets, i));
            if (i)
                *w++ = ',';
            int n = snprintf(digits, sizeof digits, "%lld", o);
            memcpy(w, digits, n);
            w += n;
        }
    }
    return out;
}

/* ------------------------------------------------------------------ write_record
 * write_record(mm, pos, total, queue_id, flag, queue_offset, phys, sys_flag, born_ts,
 *              born_host, store_ms, store_host, reconsume, prepared_offset, body, tail, pb)
 * Packs one v1 record (header, body, topic tail, properties length, properties) into the
 * writable buffer `mm` at `pos`; the body CRC is computed here. `total` must equal the
 * record size. Every argument is checked before a byte is written. */
static PyObject *sp_write_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "write_record takes 17 arguments");
        return NULL;
    }
    long long pos, total, qid, flag, qoff, phys, sys_flag, born_ts, store_ms, reconsume, prep;
    if (as_i64(args[1], &pos) < 0 || as_i64(args[2], &total) < 0 ||
        as_i32(args[3], &qid, "queue id") < 0 || as_i32(args[4], &flag, "flag") < 0 ||
        as_i64(args[5], &qoff) < 0 || as_i64(args[6], &phys) < 0 ||
        as_i32(args[7], &sys_flag, "sys flag") < 0 || as_i64(args[8], &born_ts) < 0 ||
        as_i64(args[10], &store_ms) < 0 || as_i32(args[12], &reconsume, "reconsume times") < 0 ||
        as_i64(args[13], &prep) < 0)
        return NULL;
    PyObject *born = args[9], *host = args[11], *tail = args[15], *pb = args[16];
    if (!PyBytes_Check(born) || PyBytes_GET_SIZE(born) != 8 || !PyBytes_Check(host) ||
        PyBytes_GET_SIZE(host) != 8) {
        PyErr_SetString(PyExc_ValueError, "hosts must be 8 bytes");
        return NULL;
    }
    if (!PyBytes_Check(tail) || !PyBytes_Check(pb)) {
        PyErr_SetString(PyExc_TypeError, "tail and properties must be bytes");
        return NULL;
    }
    Py_ssize_t tlen = PyBytes_GET_SIZE(tail), plen = PyBytes_GET_SIZE(pb);
    if (plen > 32767) {
        PyErr_SetString(PyExc_ValueError, "properties longer than 32767 bytes");
        return NULL;
    }
    Py_buffer body;
    if (PyObject_GetBuffer(args[14], &body, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_buffer mm;
    if (PyObject_GetBuffer(args[0], &mm, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&body);
        return NULL;
    }
    PyObject *ret = NULL;
    if (body.len > INT32_MAX || total != 88 + body.len + tlen + 2 + plen || total > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "record size does not match its parts");
        goto done;
    }
    if (pos < 0 || pos > mm.len - total) {
        PyErr_SetString(PyExc_ValueError, "record does not fit in the mapping");
        goto done;
    }
    unsigned char *p = (unsigned char *)mm.buf + pos;
    put_u32(p, (uint32_t)total);
    put_u32(p + 4, 0xDAA320A7u);
    put_u32(p + 8, crc32_buf(body.buf, body.len) & 0x7FFFFFFFu);
    put_u32(p + 12, (uint32_t)qid);
    put_u32(p + 16, (uint32_t)flag);
    put_u64(p + 20, (uint64_t)qoff);
    put_u64(p + 28, (uint64_t)phys);
    put_u32(p + 36, (uint32_t)sys_flag);
    put_u64(p + 40, (uint64_t)born_ts);
    memcpy(p + 48, PyBytes_AS_STRING(born), 8);
    put_u64(p + 56, (uint64_t)store_ms);
    memcpy(p + 64, PyBytes_AS_STRING(host), 8);
    put_u32(p + 72, (uint32_t)reconsume);
    put_u64(p + 76, (uint64_t)prep);
    put_u32(p + 84, (uint32_t)body.len);
    p += 88;
    memcpy(p, body.buf, body.len);
    p += body.len;
    memcpy(p, PyBytes_AS_STRING(tail), tlen);
    p += tlen;
    put_u16(p, (uint32_t)plen);
    memcpy(p + 2, PyBytes_AS_STRING(pb), plen);
    ret = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&mm);
    PyBuffer_Release(&body);
    return ret;
}

/* ------------------------------------------------------------------ stage_units
 * stage_units(staged: dict, cache: dict, targets: list[tuple[str, int]], unit: bytes) -> int
 * LmqIndex.add_planned's loop: append (offset, unit) to staged[name] (a new list
 * [offset, unit] for a queue not staged yet), set cache[name] = offset + 1. Returns how many
 * offsets were 0 (new LMQs). */
static PyObject *sp_stage_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "stage_units(staged: dict, cache: dict, targets: list, unit)");
        return NULL;
    }
    PyObject *staged = args[0], *cache = args[1], *targets = args[2], *unit = args[3];
    long created = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(targets); i++) {
        PyObject *t = PyList_GET_ITEM(targets, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
            PyErr_SetString(PyExc_TypeError, "targets must be (name, offset) tuples");
            return NULL;
        }
        PyObject *name = PyTuple_GET_ITEM(t, 0), *off = PyTuple_GET_ITEM(t, 1);
        PyObject *units = PyDict_GetItemWithError(staged, name);
        if (units == NULL) {
            if (PyErr_Occurred())
                return NULL;
            units = PyList_New(2);
            if (!units)
                return NULL;
            PyList_SET_ITEM(units, 0, Py_NewRef(off));
            PyList_SET_ITEM(units, 1, Py_NewRef(unit));
            int r = PyDict_SetItem(staged, name, units);
            Py_DECREF(units);
            if (r < 0)
                return NULL;
        } else {
            if (!PyList_Check(units)) {
                PyErr_SetString(PyExc_TypeError, "staged units must be lists");
                return NULL;
            }
            if (PyList_Append(units, off) < 0 || PyList_Append(units, unit) < 0)
                return NULL;
        }
        long long o;
        if (as_i64(off, &o) < 0)
            return NULL;
        if (o == 0)
            created++;
        PyObject *next = PyLong_FromLongLong(o + 1);
        if (!next)
            return NULL;
        int r = PyDict_SetItem(cache, name, next);
        Py_DECREF(next);
        if (r < 0)
            return NULL;
    }
    return PyLong_FromLong(created);
}

/* ------------------------------------------------------------------ write_units
 * write_units(snapshot: dict[str, list], put, prefixes: dict[str, bytes]) -> int
 * LmqIndex.write_staged: for every queue name in sorted order, each staged (offset, value)
 * pair becomes put(b"u" name b"\x00" int64be(offset), value). `prefixes` caches the
 * b"u" name b"\x00" of each name (the caller bounds it). Returns the number of puts. */
static PyObject *sp_write_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "write_units(snapshot: dict, put, prefixes: dict)");
        return NULL;
    }
    PyObject *snapshot = args[0], *put = args[1], *prefixes = args[2];
    PyObject *names = PyDict_Keys(snapshot);
    if (!names)
        return NULL;
    long count = 0;
    PyObject *key = NULL;
    if (PyList_Sort(names) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        PyObject *prefix = PyDict_GetItemWithError(prefixes, name);
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
            int r = PyDict_SetItem(prefixes, name, prefix);
            Py_DECREF(prefix);  /* the dict holds it */
            if (r < 0)
                goto fail;
        }
        if (!PyBytes_Check(prefix)) {
            PyErr_SetString(PyExc_TypeError, "prefixes must be bytes");
            goto fail;
        }
        Py_ssize_t plen = PyBytes_GET_SIZE(prefix);
        PyObject *units = PyDict_GetItemWithError(snapshot, name);
        if (!units || !PyList_Check(units)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "staged units must be lists");
            goto fail;
        }
        Py_INCREF(units);
        for (Py_ssize_t j = 0; j + 1 < PyList_GET_SIZE(units); j += 2) {
            long long off;
            if (as_i64(PyList_GET_ITEM(units, j), &off) < 0) {
                Py_DECREF(units);
                goto fail;
            }
            key = PyBytes_FromStringAndSize(NULL, plen + 8);
            if (!key) {
                Py_DECREF(units);
                goto fail;
            }
            memcpy(PyBytes_AS_STRING(key), PyBytes_AS_STRING(prefix), plen);
            put_u64((unsigned char *)PyBytes_AS_STRING(key) + plen, (uint64_t)off);
            PyObject *callargs[2] = {key, PyList_GET_ITEM(units, j + 1)};
            PyObject *r = PyObject_Vectorcall(put, callargs, 2, NULL);
            Py_CLEAR(key);
            if (!r) {
                Py_DECREF(units);
                goto fail;
            }
            Py_DECREF(r);
            count++;
        }
        Py_DECREF(units);
    }
    Py_DECREF(names);
    return PyLong_FromLong(count);
fail:
    Py_DECREF(names);
    return NULL;
}

/* ------------------------------------------------------------------ module */
static PyMethodDef methods[] = {
    {"crc32", sp_crc32, METH_O, "crc32(data) -> int: zlib's CRC-32 of a bytes-like object."},
    {"encode_props", (PyCFunction)(void (*)(void))sp_encode_props, METH_FASTCALL,
     "encode_props(props, offsets) -> bytes: the stored properties string."},
    {"write_record", (PyCFunction)(void (*)(void))sp_write_record, METH_FASTCALL,
     "write_record(mm, pos, total, ...): pack one record into a writable buffer."},
    {"stage_units", (PyCFunction)(void (*)(void))sp_stage_units, METH_FASTCALL,
     "stage_units(staged, cache, targets, unit) -> int: stage LMQ units; new LMQ count."},
    {"write_units", (PyCFunction)(void (*)(void))sp_write_units, METH_FASTCALL,
     "write_units(snapshot, put, prefixes) -> int: staged LMQ units into a write batch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "core._speedups",
    "The store's per-message byte work in C (see core/store/speedups.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    crc_init();
    S_WAIT = PyUnicode_InternFromString("WAIT");
    S_MULTI_OFFSETS = PyUnicode_InternFromString("INNER_MULTI_QUEUE_OFFSET");
    if (!S_WAIT || !S_MULTI_OFFSETS)
        return NULL;
    return PyModule_Create(&moddef);
}
