"""RocketMQ remoting frames, sans-IO: bytes in -> `RemotingCommand`s out, and back.

Frame layout (docs/protocol.md §1.1, big-endian)::

    int32  total_length         = 4 + header_length + body_length (not counting itself)
    int32  (serialize_type << 24) | header_length
    bytes  header               JSON (type 0, docs/protocol.md §1.2) or ROCKETMQ binary (type 1, docs/protocol.md §1.3)
    bytes  body

Nothing here knows about sockets or trio. A body may be a list of buffers (a pull
response is a run of memoryview slices of mapped CommitLog files); encoders hand those
parts on unjoined so the transport can write them with one gathered send.
"""

from __future__ import annotations

import json
import struct

from core.remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_NAMES,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    SERVER_VERSION,
)
from core.remoting.errors import FrameError, HeaderError

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "Body",
    "FrameDecoder",
    "FrameError",
    "HeaderError",
    "java_int",
    "RemotingCommand",
    "decode_frame",
    "encode_command",
    "encode_command_bytes",
]

#: Largest accepted frame (total_length), as Java's `com.rocketmq.remoting.frameMaxLength`.
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024

#: The header length field is 24 bits wide (docs/protocol.md §1.1).
MAX_HEADER_SIZE = 0xFFFFFF

Buffer = bytes | bytearray | memoryview
Body = bytes | bytearray | memoryview | list | None

_INT = struct.Struct(">i")
_UINT = struct.Struct(">I")
_PREFIX = struct.Struct(">iI")
# ROCKETMQ binary header, fixed part: code, language, version, opaque, flag (docs/protocol.md §1.3).
_BIN_FIXED = struct.Struct(">hBhii")
_SHORT = struct.Struct(">h")

_LANGUAGE_CODES = {name: code for code, name in enumerate(LANGUAGE_NAMES)}
_LANGUAGE_JSON = {name: f'"{name}"' for name in LANGUAGE_NAMES}
_OTHER_LANGUAGE = _LANGUAGE_CODES["OTHER"]

# One reusable C-accelerated encoder: compact, ASCII-only output (safe for jsoncpp).
_JSON = json.JSONEncoder(separators=(",", ":"))
_json_encode = _JSON.encode
# The C string escaper that encoder uses (ensure_ascii), and one C encoder for ext maps,
# made once: JSONEncoder.encode builds a new one on every call (a third of its cost).
# Same settings, so the same bytes; no circular-reference check (ext maps are flat).
_json_str = json.encoder.encode_basestring_ascii
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_json_map = (
    _c_make_encoder(None, _JSON.default, _json_str, None, ":", ",", False, False, True)
    if _c_make_encoder is not None else None
)
# The C scanner behind json.loads, called directly: a header is one JSON object, and
# loads() spends as long on its regex-based checks around the scan as on the scan.
_json_scan = json.JSONDecoder().scan_once
_JSON_BLANKS = " \t\n\r"

_TRUE_WORDS = frozenset(("1", "true"))
_FALSE_WORDS = frozenset(("0", "false"))


def java_int(value: object) -> int:
    """An integer header value as Java's Integer.parseInt / Long.parseLong reads it: an
    optional sign and digits, nothing else (no blanks, no `_`, no JSON true). Digits are
    ASCII only (Java would also take other Unicode decimal digits; no client sends
    them). JSON numbers from the C++ client are taken as they are. ValueError
    otherwise; the caller checks the range."""
    if type(value) is int:
        return value
    if type(value) is not str:
        raise ValueError(value)
    digits = value[1:] if value[:1] in ("+", "-") else value
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(value)
    return int(value)



class RemotingCommand:
    """One remoting frame: a request (``flag & 1 == 0``) or a response.

    `ext_fields` maps header field names to strings (decoded values are always `str`;
    values set locally may be ints or bools and are converted when encoded or read with
    the ``ext_*`` helpers). `body` is bytes, a memoryview, a list of those, or None.
    """

    __slots__ = (
        "code",
        "language",
        "version",
        "opaque",
        "flag",
        "remark",
        "ext_fields",
        "body",
        "serialize_type",
    )

    def __init__(
        self,
        code: int,
        language: str = "JAVA",
        version: int = SERVER_VERSION,
        opaque: int = 0,
        flag: int = 0,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: Body = None,
        serialize_type: int = SERIALIZE_JSON,
    ) -> None:
        self.code = code
        self.language = language
        self.version = version
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields = ext_fields
        self.body = body
        self.serialize_type = serialize_type

    # -- construction ---------------------------------------------------------------

    @classmethod
    def request(
        cls, code: int, ext_fields: dict[str, str] | None = None, body: Body = None
    ) -> RemotingCommand:
        """A two-way request; the transport assigns `opaque` when it is sent."""
        return cls(code, ext_fields=ext_fields, body=body)

    @classmethod
    def response(
        cls,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: Body = None,
    ) -> RemotingCommand:
        """A response (flag bit 0 set); the server copies the request's opaque into it."""
        return cls(code, flag=FLAG_RESPONSE, remark=remark, ext_fields=ext_fields, body=body)

    def make_response(
        self,
        code: int = 0,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: Body = None,
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialization (docs/protocol.md §1.4 rule 1)."""
        return RemotingCommand(
            code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=ext_fields,
            body=body,
            serialize_type=self.serialize_type,
        )

    # -- flags and body -------------------------------------------------------------

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def body_bytes(self) -> bytes:
        """The body as one bytes object (joins a list body; b"" when absent)."""
        body = self.body
        if body is None:
            return b""
        if type(body) is bytes:
            return body
        if type(body) is list:
            return b"".join(body)
        return bytes(body)

    @property
    def body_length(self) -> int:
        body = self.body
        if body is None:
            return 0
        if type(body) is list:
            return sum(map(len, body))
        return len(body)

    # -- ext field access (docs/protocol.md §1.4 rules 4 and 5) --------------------------------------

    def ext_str(self, name: str, default: str | None = None, required: bool = False) -> str | None:
        """Ext field `name` as a string; `default` when absent, HeaderError if `required`."""
        ext = self.ext_fields
        value = ext.get(name) if ext else None
        if value is None:
            if required:
                raise HeaderError(name, "missing required ext field")
            return default
        if type(value) is not str:
            return _ext_value_to_str(value)
        return value

    def ext_int(self, name: str, default: int | None = None, required: bool = False) -> int | None:
        """Ext field `name` as an int. An empty string counts as absent."""
        ext = self.ext_fields
        value = ext.get(name) if ext else None
        if type(value) is int:
            return value
        if value is None or value == "":
            if required:
                raise HeaderError(name, "missing required ext field")
            return default
        try:
            return java_int(value)
        except ValueError:
            raise HeaderError(name, f"invalid integer {value!r} in ext field") from None

    def ext_bool(
        self, name: str, default: bool | None = None, required: bool = False
    ) -> bool | None:
        """Ext field `name` as a bool: "1"/"true" and "0"/"false", any case (docs/protocol.md §1.4 rule 5)."""
        ext = self.ext_fields
        value = ext.get(name) if ext else None
        if type(value) is bool:
            return value
        if value is None or value == "":
            if required:
                raise HeaderError(name, "missing required ext field")
            return default
        word = str(value).strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise HeaderError(name, f"invalid boolean {value!r} in ext field")

    def __repr__(self) -> str:
        kind = "response" if self.flag & FLAG_RESPONSE else "request"
        return (
            f"<RemotingCommand {kind} code={self.code} opaque={self.opaque} flag={self.flag} "
            f"remark={self.remark!r} ext={self.ext_fields!r} body={self.body_length}B>"
        )


# ---------------------------------------------------------------------------------------
# ext value normalisation


def _ext_value_to_str(value: object) -> str:
    # Java's extFields is a String->String map; C++ sends some values as JSON numbers.
    if type(value) is bool:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))  # int() also turns an IntEnum into plain digits
    if isinstance(value, (float, str)):
        return str(value)
    return _json_encode(value)


def _normalise_ext(ext: dict) -> dict[str, str]:
    for value in ext.values():
        if type(value) is not str:
            break
    else:
        return ext
    return {k: _ext_value_to_str(v) for k, v in ext.items() if v is not None}


def _ext_json(ext: dict[str, str]) -> str:
    """JSON of a normalised ext map, identical to `_json_encode(ext)`."""
    if _json_map is None:
        return _json_encode(ext)
    return "".join(_json_map(ext, 0))


# ---------------------------------------------------------------------------------------
# header encoding


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    # Keys in fastjson's alphabetical order, as a Java broker writes them (docs/protocol.md §1.2). Built by
    # hand around the C encoder: only the variable strings go through json.
    lang = _LANGUAGE_JSON.get(cmd.language) or _json_encode(str(cmd.language))
    ext = cmd.ext_fields
    remark = cmd.remark
    ext_part = "" if ext is None else ',"extFields":' + _ext_json(_normalise_ext(ext))
    remark_part = "" if remark is None else ',"remark":' + _json_str(str(remark))
    return (
        f'{{"code":{int(cmd.code)}{ext_part},"flag":{int(cmd.flag)},"language":{lang}'
        f',"opaque":{int(cmd.opaque)}{remark_part}'
        f',"serializeTypeCurrentRPC":"JSON","version":{int(cmd.version)}}}'
    ).encode("ascii")


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    out = bytearray(
        _BIN_FIXED.pack(
            int(cmd.code),
            _LANGUAGE_CODES.get(cmd.language, _OTHER_LANGUAGE),
            int(cmd.version),
            int(cmd.opaque),
            int(cmd.flag),
        )
    )
    if cmd.remark:
        remark = str(cmd.remark).encode("utf-8", "replace")
        out += _INT.pack(len(remark))
        out += remark
    else:
        out += _INT.pack(0)
    ext = cmd.ext_fields
    if ext:
        table = bytearray()
        for key, value in _normalise_ext(ext).items():
            kb = key.encode("utf-8", "replace")
            vb = value.encode("utf-8", "replace")
            table += _SHORT.pack(len(kb))
            table += kb
            table += _INT.pack(len(vb))
            table += vb
        out += _INT.pack(len(table))
        out += table
    else:
        out += _INT.pack(0)
    return bytes(out)


def encode_command(cmd: RemotingCommand) -> list[Buffer]:
    """Encode `cmd` as [length prefix + header, *body parts]; body parts are not copied.

    Raises ValueError when the header cannot be encoded (too large, field out of range).
    """
    try:
        if cmd.serialize_type == SERIALIZE_ROCKETMQ:
            header = _encode_binary_header(cmd)
        else:
            header = _encode_json_header(cmd)
    except (struct.error, TypeError) as exc:  # e.g. a code that does not fit int16
        raise ValueError(f"cannot encode remoting header: {exc}") from None
    hlen = len(header)
    if hlen > MAX_HEADER_SIZE:
        raise ValueError(f"remoting header too large: {hlen} bytes")
    body = cmd.body
    if body is None:
        return [_PREFIX.pack(4 + hlen, (cmd.serialize_type << 24) | hlen) + header]
    if type(body) is list:
        blen = sum(map(len, body))
        first = _PREFIX.pack(4 + hlen + blen, (cmd.serialize_type << 24) | hlen) + header
        return [first, *body] if blen else [first]
    blen = len(body)
    first = _PREFIX.pack(4 + hlen + blen, (cmd.serialize_type << 24) | hlen) + header
    return [first, body] if blen else [first]


def encode_command_bytes(cmd: RemotingCommand) -> bytes:
    """Encode `cmd` as one bytes object."""
    return b"".join(encode_command(cmd))


# ---------------------------------------------------------------------------------------
# header decoding


def _loads(raw: memoryview):
    """json.loads of the header bytes (same result, same errors)."""
    # The C++ client ends its header with "\n" (docs/protocol.md §1.2); JSON allows trailing blanks.
    try:
        text = str(raw, "utf-8")
        if text[:1] == "{":
            obj, end = _json_scan(text, 0)
            if end == len(text) or not text[end:].strip(_JSON_BLANKS):
                return obj
    except (ValueError, RecursionError, StopIteration):
        pass  # the slow path below raises the error json.loads gives
    try:
        return json.loads(str(raw, "utf-8"))
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"header is not valid JSON: {exc}") from None


def _decode_json_header(raw: memoryview) -> RemotingCommand:
    obj = _loads(raw)
    if type(obj) is not dict:
        raise FrameError("header is not a JSON object")
    code = obj.get("code")
    if type(code) is not int:
        raise FrameError("header has no integer 'code'")
    language = obj.get("language")
    if type(language) is not str:
        language = "JAVA" if language is None else str(language)
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:
        remark = _ext_value_to_str(remark)
    ext = obj.get("extFields")
    if ext is not None:
        if type(ext) is not dict:
            raise FrameError("header 'extFields' is not a JSON object")
        ext = _normalise_ext(ext)
    version = obj.get("version", 0)
    opaque = obj.get("opaque", 0)
    flag = obj.get("flag", 0)
    if type(version) is not int or type(opaque) is not int or type(flag) is not int:
        version = _header_int(obj, "version")
        opaque = _header_int(obj, "opaque")
        flag = _header_int(obj, "flag")
    return RemotingCommand(code, language, version, opaque, flag, remark, ext)


def _header_int(obj: dict, key: str) -> int:
    value = obj.get(key, 0)
    if type(value) is int:
        return value
    if value is None:
        return 0
    raise FrameError(f"header field {key!r} is not an integer")


def _decode_binary_header(raw: memoryview) -> RemotingCommand:
    n = len(raw)
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(raw, 0)
        pos = _BIN_FIXED.size
        (rlen,) = _INT.unpack_from(raw, pos)
        pos += 4
        if rlen < 0 or pos + rlen > n:
            raise FrameError("binary header: bad remark length")
        remark = str(raw[pos : pos + rlen], "utf-8") if rlen else None
        pos += rlen
        (elen,) = _INT.unpack_from(raw, pos)
        pos += 4
        if elen < 0 or pos + elen > n:
            raise FrameError("binary header: bad extFields length")
        ext = None
        if elen:
            ext = {}
            end = pos + elen
            while pos < end:
                (klen,) = _SHORT.unpack_from(raw, pos)
                pos += 2
                if klen <= 0 or pos + klen > end:
                    raise FrameError("binary header: bad ext key length")
                key = str(raw[pos : pos + klen], "utf-8")
                pos += klen
                (vlen,) = _INT.unpack_from(raw, pos)
                pos += 4
                if vlen < 0 or pos + vlen > end:
                    raise FrameError("binary header: bad ext value length")
                ext[key] = str(raw[pos : pos + vlen], "utf-8")
                pos += vlen
    except struct.error:
        raise FrameError("binary header truncated") from None
    except UnicodeDecodeError:
        raise FrameError("binary header: invalid UTF-8") from None
    language = LANGUAGE_NAMES[lang] if lang < len(LANGUAGE_NAMES) else "OTHER"
    return RemotingCommand(
        code, language, version, opaque, flag, remark, ext, serialize_type=SERIALIZE_ROCKETMQ
    )


def _decode_payload(mv: memoryview, start: int, total: int) -> RemotingCommand:
    """Decode the frame whose total_length `total` follows the prefix at `start`."""
    (word,) = _UINT.unpack_from(mv, start)
    stype = word >> 24
    hlen = word & 0xFFFFFF
    if hlen > total - 4:
        raise FrameError(f"header length {hlen} exceeds frame length {total}")
    hstart = start + 4
    bstart = hstart + hlen
    if stype == SERIALIZE_JSON:
        cmd = _decode_json_header(mv[hstart:bstart])
    elif stype == SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(mv[hstart:bstart])
    else:
        raise FrameError(f"unknown serialize type {stype}")
    end = start + total
    if bstart < end:
        # One copy out of the receive buffer, which is about to be reused.
        cmd.body = bytes(mv[bstart:end])
    return cmd


class FrameDecoder:
    """Incremental frame decoder: `feed(bytes)` returns the complete commands so far.

    Raises `FrameError` on a malformed stream; the decoder then stays failed (the stream
    cannot be resynchronised) and the connection must be closed. When valid frames come
    before the malformed one in the same chunk, `feed` returns them first and sets
    `error`; the caller answers them, then closes (the next `feed` raises).
    """

    __slots__ = ("max_frame_size", "error", "_buf", "_failed")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        #: The FrameError met after the frames the last `feed` returned, if any.
        self.error: FrameError | None = None
        self._buf = bytearray()
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)

    @property
    def header_complete(self) -> bool:
        """True once the buffered partial frame's prefix and whole header have arrived
        (only its body is missing); False when nothing or less is buffered."""
        buf = self._buf
        n = len(buf)
        if n < 8:
            return False
        hlen = _UINT.unpack_from(buf, 4)[0] & 0xFFFFFF
        return n >= 8 + hlen

    def feed(self, data: Buffer) -> list[RemotingCommand]:
        if self._failed:
            raise self.error or FrameError("decoder already failed on this stream")
        buf = self._buf
        buf += data
        n = len(buf)
        out: list[RemotingCommand] = []
        if n < 8:
            return out
        pos = 0
        limit = self.max_frame_size
        try:
            with memoryview(buf) as mv:
                while n - pos >= 4:
                    (total,) = _INT.unpack_from(mv, pos)
                    if total < 4 or total > limit:
                        raise FrameError(
                            f"frame length {total} outside [4, {limit}]"
                        )
                    end = pos + 4 + total
                    if end > n:
                        break
                    out.append(_decode_payload(mv, pos + 4, total))
                    pos = end
        except FrameError as exc:
            # Slices of `buf` may live on in the traceback, so `buf` is dropped, not
            # resized (resizing an exported bytearray raises BufferError).
            self._failed = True
            self.error = exc
            self._buf = bytearray()
            if out:
                return out
            raise
        if pos:
            # bytearray deletes a prefix in O(1) amortised (it moves its start).
            del buf[:pos]
        return out


def decode_frame(frame: Buffer, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> RemotingCommand:
    """Decode exactly one complete frame (with its length prefix)."""
    decoder = FrameDecoder(max_frame_size)
    cmds = decoder.feed(frame)
    if len(cmds) != 1 or decoder.buffered:
        raise FrameError("expected exactly one complete frame")
    return cmds[0]

