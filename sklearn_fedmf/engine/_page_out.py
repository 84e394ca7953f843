"""A federation's state out of memory while something else runs, and back bit for bit.

After the rounds a fit still holds its state (the server's and every client's: warm starts
continue it), while the biases floor fits a second federation
(:mod:`sklearn_fedmf.completion._validation`): at one client per user the two together are
the fit's peak (issue 38: the floor's fits added 4 to 7 GB at the Netflix shape to states of
5 to 15 GB). :func:`paged_out` writes the state's large arrays to an unnamed temporary file
and gives their memory back to the system (``madvise(MADV_DONTNEED)`` on the whole pages
inside each buffer), then reads them back into the same buffers: every object that refers to
them stays valid, nothing is copied or rebuilt, and the values are the same bytes. Nothing
may read or write the paged-out arrays in between (their pages read as zeros): arrays that
the caller's work reads (``keep``) stay in memory, and so does any array that shares a
buffer with them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import tempfile
from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp

__all__ = ["PAGE_OUT_MIN_BYTES", "move_bytes", "paged_out"]

# a state whose large arrays hold fewer bytes stays in memory (the file's write and read
# cost more than the memory is worth)
PAGE_OUT_MIN_BYTES = 2**30
_ARRAY_MIN = 2**20  # (an array below this stays in memory)


def _buffers(obj, seen, out):
    """The owning arrays (``base`` followed to the end) of the arrays reachable from ``obj``
    through dicts, lists, tuples, sparse matrices and the package's own objects, by address."""
    if id(obj) in seen or isinstance(obj, (int, float, complex, bool, str, bytes, np.generic,
                                           type(None))):
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        root = obj
        while isinstance(root.base, np.ndarray):
            root = root.base
        if root.base is None and root.dtype != object:  # (numpy's own allocation)
            out[root.__array_interface__["data"][0]] = root
        return
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif sp.issparse(obj) or type(obj).__module__.startswith("sklearn_fedmf"):
        items = list(getattr(obj, "__dict__", {}).values()) + [
            getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)]
    else:
        return
    for item in items:
        _buffers(item, seen, out)


def _pages(root):
    """``(start, length)`` of the whole pages inside ``root``'s buffer."""
    address = root.__array_interface__["data"][0]
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + root.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    return start, max(end - start, 0)


def _libc():
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def move_bytes(call, fd, view, offset, what):
    """Write (``os.pwrite``) or read (``os.preadv``) the bytes of ``view`` (a byte
    memoryview) at ``offset`` of ``fd``, in as many calls as it takes (each moves at most
    about 2 GB); ``what`` names the file in the error."""
    done = 0
    while done < len(view):
        part = view[done:]
        n = call(fd, part, offset + done) if call is os.pwrite else call(fd, [part],
                                                                         offset + done)
        if n <= 0:
            raise OSError(f"{what}: {n} bytes moved at {offset + done}")
        done += n


def _move(call, fd, start, length, offset):
    """:func:`move_bytes` of the memory ``start:start + length``."""
    view = memoryview((ctypes.c_char * length).from_address(start)).cast("B")
    move_bytes(call, fd, view, offset, "the paged-out state's file")


@contextmanager
def paged_out(state, keep=(), min_bytes=None):
    """Run the ``with`` body with the large arrays of ``state`` out of memory (module
    docstring); yields the bytes released (0: nothing left memory).

    ``keep``: objects whose arrays stay in memory (what the body reads). Only on Linux, and
    only when the arrays hold at least ``min_bytes`` (default :data:`PAGE_OUT_MIN_BYTES`);
    else, or when the file cannot be written, the body runs with the state in memory."""
    min_bytes = PAGE_OUT_MIN_BYTES if min_bytes is None else min_bytes
    libc = _libc()
    roots, kept = {}, {}
    if libc is not None:
        _buffers(state, set(), roots)
        _buffers(keep, set(), kept)
    regions = [_pages(root) for address, root in sorted(roots.items())
               if address not in kept and root.nbytes >= _ARRAY_MIN]
    regions = [(start, length) for start, length in regions if length > 0]
    if not regions or sum(length for _, length in regions) < min_bytes:
        yield 0
        return
    with tempfile.TemporaryFile() as file:
        fd, offset, done = file.fileno(), 0, []
        try:
            for start, length in regions:
                _move(os.pwrite, fd, start, length, offset)
                done.append((start, length, offset))
                offset += length
        except OSError:  # (no room for the file: the state stays in memory)
            done = []
        released = 0
        try:
            for start, length, _ in done:
                if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length),
                                mmap.MADV_DONTNEED) == 0:
                    released += length
            yield released
        finally:  # (the same bytes back, whether or not madvise released them)
            # what the body freed goes back to the system first: else the allocator keeps
            # it and the state comes back on top of it (measured: the floor's 0.6 GB at
            # the ML-10M shape above the rounds' peak)
            trim = getattr(libc, "malloc_trim", None)
            if trim is not None and done:
                trim(0)
            for start, length, at in done:
                _move(os.preadv, fd, start, length, at)
