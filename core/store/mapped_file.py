"""Fixed-size memory-mapped files, the unit of CommitLog and ConsumeQueue storage.

Readers get zero-copy `memoryview` slices of the mapping. A mapping with live slices cannot
be closed (`BufferError`), so `close()` never insists: the file is unlinked and the mapping
is released by the garbage collector when the last slice is dropped (CPython keeps the
mmap object alive through its exported buffers).
"""

from __future__ import annotations

import errno
import mmap
import os

NAME_DIGITS = 20  # file names are 20-digit zero-padded start offsets (docs/protocol.md §7.9)

# Zeroing a torn tail goes chunk by chunk so untouched (still zero) regions cost a read only.
_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)


def file_name(start: int) -> str:
    return str(start).zfill(NAME_DIGITS)


def list_numbered_files(directory: str) -> list[tuple[int, str]]:
    """(start offset, path) of every 20-digit file in `directory`, sorted by offset."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = [
        (int(n), os.path.join(directory, n))
        for n in names
        if len(n) == NAME_DIGITS and n.isdigit()
    ]
    out.sort()
    return out


class MappedFile:
    """One file of `size` bytes mapped read-write; `start` is its global start offset."""

    __slots__ = ("path", "start", "size", "fd", "mm", "view", "dirty", "closed", "reserved")

    def __init__(
        self, path: str, start: int, size: int, *, create: bool = False, keep_fd: bool = True,
    ) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(fd).st_size
            if actual > size:
                raise ValueError(f"{path}: size {actual} > configured {size}")
            if actual < size:
                # New file (sparse, as RocketMQ's default), or a tail cut short (a truncated
                # last file): pad with zeros.
                os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if create:
                _unlink_quietly(path)
            raise
        if not keep_fd:
            os.close(fd)
            fd = -1
        self.path = path
        self.start = start
        self.size = size
        self.fd = fd
        self.mm = mm
        self.view = memoryview(mm)
        self.dirty = False  # set by the writer, cleared by the flusher (see flush())
        self.closed = False
        self.reserved = 0  # bytes [0, reserved) have disk blocks (see reserve())

    def reserve(self, upto: int, step: int) -> None:
        """Give bytes [0, upto) disk blocks, `step` bytes ahead (posix_fallocate). A write
        through the mapping into a hole of a full disk is a SIGBUS that kills the process;
        after this, the only failure is an OSError here, before anything is written.
        Files are sparse otherwise, so an idle store costs no disk."""
        if upto <= self.reserved:
            return
        end = min(self.size, max(upto, self.reserved + step))
        if self.fd >= 0 and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(self.fd, self.reserved, end - self.reserved)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                end = self.size  # no fallocate on this filesystem: nothing to reserve
        self.reserved = end

    @property
    def end(self) -> int:
        return self.start + self.size

    def sync(self) -> None:
        """fdatasync the file. Unlike mmap.flush() (msync under the GIL), os.fdatasync
        releases the GIL, and on Linux it writes back pages dirtied through the mapping."""
        if self.closed:
            return
        if self.fd >= 0:
            try:
                os.fdatasync(self.fd)
            except OSError as exc:  # closed concurrently by retention
                if exc.errno != errno.EBADF:
                    raise
            return
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def zero_from(self, pos: int) -> int:
        """Zero bytes [pos, size) that are not zero yet; return how many bytes were written.

        Holes of the file are skipped with SEEK_DATA where the filesystem supports it, so a
        mostly-empty 1 GiB file costs little; other regions are compared chunk by chunk.
        """
        written = 0
        for lo, hi in self._data_regions(pos):
            p = lo
            while p < hi:
                q = min(hi, (p // _ZERO_CHUNK + 1) * _ZERO_CHUNK)
                if self.view[p:q] != _ZEROS[: q - p]:
                    self.view[p:q] = _ZEROS[: q - p]
                    written += q - p
                p = q
        return written

    def _data_regions(self, pos: int) -> list[tuple[int, int]]:
        fd = self.fd if self.fd >= 0 else os.open(self.path, os.O_RDONLY)
        try:
            regions = []
            p = pos
            while p < self.size:
                try:
                    lo = os.lseek(fd, p, os.SEEK_DATA)
                    hi = os.lseek(fd, lo, os.SEEK_HOLE)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data after p
                        break
                    return [(pos, self.size)]  # no SEEK_DATA support: scan everything
                lo, hi = max(lo, pos), min(hi, self.size)
                if lo >= self.size:
                    break
                regions.append((lo, hi))
                p = hi
            return regions
        except AttributeError:  # platform without SEEK_DATA
            return [(pos, self.size)]
        finally:
            if fd != self.fd:
                os.close(fd)

    def close(self) -> bool:
        """Release the mapping and the fd. Returns False when readers still hold slices: the
        mapping is then freed by the garbage collector once they are released."""
        if self.closed:
            return True
        self.closed = True
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        self.view.release()
        try:
            self.mm.close()
            return True
        except BufferError:
            return False

    def destroy(self) -> bool:
        """Close and delete the file (retention); see close() for the return value."""
        done = self.close()
        _unlink_quietly(self.path)
        return done


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
