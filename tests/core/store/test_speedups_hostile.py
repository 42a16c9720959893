"""core._speedups against callers that break its assumptions: Python code that runs in the
middle of a C function (a hostile __index__, a put callback) and positions or items that
point outside the buffers. Each case runs in a child interpreter, so a crash (what these
did before the entry points were hardened) fails the test instead of killing the run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

try:
    import core._speedups  # noqa: F401
except ImportError:  # pragma: no cover - test_speedups.test_extension_is_built reports it
    pytest.skip("core._speedups not built", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HERE = os.path.dirname(os.path.abspath(__file__))


# Under .ci/asan the child must load the ASan build as well (its sitecustomize is on
# PYTHONPATH, which the child keeps).
_CHECK = """
import os as _os, core._speedups as _c
_want = _os.environ.get("LMQ_SPEEDUPS_EXPECTED")
assert not _want or _os.path.realpath(_c.__file__) == _os.path.realpath(_want), _c.__file__
"""


def run_isolated(code: str) -> str:
    """Run `code` in a child interpreter that imports this tree's core._speedups; it must
    exit 0 (a segfault is -11, a failed assert 1). Returns its stdout."""
    paths = [ROOT, HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.run([sys.executable, "-c", _CHECK + textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_encode_props_index_that_empties_the_offsets_list():
    """An offset whose __index__ cleared the list made the C loop read freed slots."""
    out = run_isolated("""
        import core._speedups as c
        offsets = []
        class Hostile:
            def __index__(self):
                offsets.clear()
                return 1
        offsets.extend([Hostile(), 2, 3])
        try:
            c.encode_props({"a": "b"}, offsets)
        except TypeError:
            print("refused")
    """)
    assert out.strip() == "refused"


def test_encode_props_index_that_grows_the_properties():
    """Sized in one pass, copied in a second: an __index__ between them that added a
    property made the copy run past the output."""
    out = run_isolated("""
        import core._speedups as c
        props = {"a": "b"}
        class Hostile:
            def __index__(self):
                for i in range(200):
                    props["k%d" % i] = "v" * 1000
                return 1
        try:
            c.encode_props(props, [Hostile()])
        except TypeError:
            print("refused")
    """)
    assert out.strip() == "refused"


def test_write_units_put_that_drops_the_prefix_cache():
    """The prefix was a borrowed reference kept across put(): a put that cleared the
    prefix cache freed it, and the next key was built from freed memory."""
    out = run_isolated("""
        import core._speedups as c
        prefixes = {}
        keys = []
        def put(key, value):
            keys.append(key)
            prefixes.clear()
            put.junk = [bytes([65]) * 9 for _ in range(1000)]  # reuse the freed block
        n = c.write_units({"%LMQ%a": [0, b"x", 1, b"y"]}, put, prefixes)
        assert n == 2, n
        assert keys == [b"u%LMQ%a\\x00" + bytes(8), b"u%LMQ%a\\x00" + bytes(7) + b"\\x01"], keys
        print("ok")
    """)
    assert out.strip() == "ok"


def test_write_units_put_that_empties_the_units():
    out = run_isolated("""
        import core._speedups as c
        snapshot = {"%LMQ%a": [0, b"x", 1, b"y", 2, b"z"]}
        got = []
        def put(key, value):
            got.append(value)
            snapshot["%LMQ%a"].clear()
            put.junk = [object() for _ in range(1000)]
        assert c.write_units(snapshot, put, {}) == 1
        assert got == [b"x"], got
        print("ok")
    """)
    assert out.strip() == "ok"


_COLLIDER = """
class Collider:
    # A dict key with the hash of "%LMQ%a": looking "%LMQ%a" up calls its __eq__.
    def __init__(self, victim):
        self.victim = victim
    def __hash__(self):
        return hash("%LMQ%a")
    def __eq__(self, other):
        if self.victim is not None:  # armed once the containers are built
            self.victim.clear()
            __import__("gc").collect()
        return False
"""


def test_plan_lmqs_lookup_that_empties_the_names():
    """A cache key whose __eq__ cleared the names list while the C loop indexed it."""
    out = run_isolated(_COLLIDER + """
import core._speedups as c
names = ["%LMQ%b", "%LMQ%a", "%LMQ%c"]
collider = Collider(None)
cache = {collider: 0}  # first in the probe order of "%LMQ%a"
cache.update({"%LMQ%a": 1, "%LMQ%b": 2, "%LMQ%c": 3})
collider.victim = names
try:
    print(c.plan_lmqs(names, cache, "T", {}))
except (TypeError, ValueError, OverflowError) as exc:
    print(type(exc).__name__)
""")
    # planned from the names as they were when the call began
    assert out.strip() == "([2, 1, 3], [('%LMQ%b', 2), ('%LMQ%a', 1), ('%LMQ%c', 3)], 0)"


def test_stage_units_lookup_that_empties_the_targets():
    """A staged key whose __eq__ cleared the targets list while the C loop indexed it."""
    out = run_isolated(_COLLIDER + """
import core._speedups as c
targets = [("%LMQ%b", 0), ("%LMQ%a", 4), ("%LMQ%c", 0)]
collider = Collider(None)
staged = {collider: [9, b"old"]}
collider.victim = targets
cache = {}
print(c.stage_units(staged, cache, targets, b"U"), sorted(cache.items()))
""")
    assert out.strip() == "2 [('%LMQ%a', 5), ('%LMQ%b', 1), ('%LMQ%c', 1)]"


@pytest.mark.parametrize("case, spoil", [
    # a negative position wrote before the buffer
    ("negative pos", "args[1] = -(1 << 40)"),
    ("pos past the end", "args[1] = len(mm) + 10"),
    ("negative item index", "args[4] = -5"),
    ("item index past the end", "args[4] = len(items) + 1"),
    ("keys not bytes", "items[0] = items[0][:7] + (12345,) + items[0][8:]"),
    ("unique key not bytes", "items[0] = items[0][:8] + ([1],) + items[0][9:]"),
    ("body slice outside the body", "items[1] = (items[1][0], 10**6) + items[1][2:]"),
    ("properties past 32767 bytes", "items[0] = items[0][:3] + (b'x' * 40000,"
                                    " 0, 88 + 6 + 3 + 2 + 40000) + items[0][6:]"),
    ("flag out of int32", "items[0] = (1 << 40,) + items[0][1:]"),
    ("bool for an int", "args[1] = True"),
    ("bytes subclass for the body", "args[14] = type('B', (bytes,), {})(body)"),
    ("tuple for the items", "args[3] = tuple(items)"),
    ("cq_units is the target", "args[18] = mm"),
])
def test_write_batch_refuses_what_write_record_refuses(case, spoil):
    """write_batch trusted its caller: no check of pos, of the item index, of the item
    types or of the properties length. Each spoiled call must raise TypeError, ValueError
    or OverflowError and leave the buffer outside [pos, len) untouched."""
    out = run_isolated(f"""
        import core._speedups as c
        from speedups_cases import batch_args, batch_body, split_args
        body = batch_body()
        items = c.split_batch(*split_args(body))
        mm = bytearray(4096)
        args = batch_args(items, body, mm, pos=2048, pending=[])
        {spoil}
        try:
            c.write_batch(*args)
        except (TypeError, ValueError, OverflowError) as exc:
            print(type(exc).__name__)
        else:
            print("accepted")
        assert mm == bytearray(4096), "written"
    """)
    assert out.strip() in ("TypeError", "ValueError", "OverflowError"), case


def test_write_batch_negative_pos_into_an_mmap():
    out = run_isolated("""
        import mmap
        import core._speedups as c
        from speedups_cases import batch_args, batch_body, split_args
        body = batch_body()
        items = c.split_batch(*split_args(body))
        mm = mmap.mmap(-1, 4096)
        try:
            c.write_batch(*batch_args(items, body, mm, pos=-4096 * 64))
        except ValueError:
            print("refused")
    """)
    assert out.strip() == "refused"
