"""ConsumeQueue files: units, rollover, max offset on load, cut of lost units, retention."""

from __future__ import annotations

import os
from collections import deque

from core.store.consume_queue import UNIT_SIZE, ConsumeQueue, delete_expired_files_on_disk


def _cq(tmp_path, upf=10):
    return ConsumeQueue(str(tmp_path), "T", 3, upf, deque())


def _filled(tmp_path, n: int, size: int = 100) -> ConsumeQueue:
    """A fresh queue holding `n` units: record i at i * size, `size` bytes, tag code 0."""
    cq = _cq(tmp_path)
    cq.load(0)
    for i in range(n):
        cq.append(i * size, size, 0)
    return cq


def test_append_and_read_units_across_files(tmp_path):
    cq = _cq(tmp_path)
    cq.load(commitlog_end=0)
    for i in range(25):
        assert cq.append(i * 100, 100, i) == i
    assert cq.max_offset == 25
    names = sorted(os.listdir(tmp_path / "T" / "3"))
    assert names == [str(n * 10 * UNIT_SIZE).zfill(20) for n in range(3)]
    units = cq.units(8, 5)
    assert units == [(i * 100, 100, i) for i in range(8, 13)]
    assert cq.units(24, 10) == [(2400, 100, 24)]
    assert cq.unit(25) is None
    cq.close()


def test_load_finds_max_offset_and_cuts_units_past_the_commitlog_end(tmp_path):
    cq = _filled(tmp_path, 23)
    cq.close()
    again = _cq(tmp_path)
    again.load(commitlog_end=100_000)
    assert again.max_offset == 23
    again.close()
    # The CommitLog was cut at 1950: units of records ending after it go.
    cut = _cq(tmp_path)
    cut.load(commitlog_end=1950)
    assert cut.max_offset == 19  # record 18 ends at 1900, record 19 at 2000
    assert cut.append(1900, 50, 0) == 19
    cut.close()


def test_load_of_exactly_full_files(tmp_path):
    cq = _filled(tmp_path, 20, size=1)
    cq.close()
    again = _cq(tmp_path)
    again.load(10**9)
    assert again.max_offset == 20
    assert again.append(20, 1, 0) == 20
    again.close()


def test_put_at_is_idempotent_and_keeps_existing_tag_codes(tmp_path):
    cq = _cq(tmp_path)
    cq.load(0)
    cq.append(0, 10, 777)
    cq.put_at(0, 0, 10, 5)  # same record: kept as is
    assert cq.unit(0) == (0, 10, 777)
    cq.put_at(1, 10, 10, 5)
    cq.put_at(1, 10, 10, 5)
    assert cq.max_offset == 2
    assert cq.append(20, 10, 0) == 2
    cq.close()


def test_min_offset_and_file_deletion_follow_the_commitlog(tmp_path):
    cq = _filled(tmp_path, 35)
    assert cq.min_offset(0) == 0
    assert cq.min_offset(1250) == 13  # first unit at or above 1250 is 1300
    assert cq.delete_expired_files(1250) == 1  # file 0 (units 0..9) all below
    assert cq.min_offset(1250) == 13
    assert cq.units(13, 2) == [(1300, 100, 0), (1400, 100, 0)]
    assert cq.units(0, 3) == []  # below the minimum: gone
    assert cq.delete_expired_files(10**9) == 2  # never the last file
    assert cq.min_offset(10**9) == 35
    cq.close()


def test_retention_of_a_queue_that_is_not_loaded(tmp_path):
    cq = _filled(tmp_path, 25)
    cq.close()
    qdir = str(tmp_path / "T" / "3")
    assert delete_expired_files_on_disk(qdir, 10 * UNIT_SIZE, 1500) == 1
    assert delete_expired_files_on_disk(qdir, 10 * UNIT_SIZE, 10**9) == 1
    again = _cq(tmp_path)
    again.load(10**9)
    assert again.max_offset == 25
    assert again.min_offset(10**9) == 25
    again.close()
