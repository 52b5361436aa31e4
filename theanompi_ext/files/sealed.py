"""Sealed HDF5 files: a checksum in the user block, checked before h5py reads.

:func:`seal` / :func:`unseal`: an HDF5 file built with a 512-byte user
block (``h5py.File(..., userblock_size=USERBLOCK)``) carries in that
block the SHA-256 and the length of the rest of the file. ``unseal``
checks them before h5py sees a byte, so flipped bytes or a truncated file
are refused with a message instead of being read (or crashing HDF5).
"""
import hashlib
import re

from ..errors import CorruptFile

#: Bytes reserved at the start of a sealed HDF5 file (a valid HDF5 user block size).
USERBLOCK = 512
_MAGIC = b'theanompi-ext sealed v1\n'
_HEADER = re.compile(rb'sha256 ([0-9a-f]{64})\nsize (\d+)\n')


def seal(data):
    """Fill the user block of an HDF5 image ``data`` with the checksum of the rest.

    ``data`` must have been built with ``userblock_size=USERBLOCK``. A writable
    buffer (``BytesIO.getbuffer()``, a bytearray) is sealed in place and
    returned, so a large checkpoint is not copied; bytes give new bytes.
    """
    view = memoryview(data)
    if view.readonly:
        return bytes(seal(bytearray(data)))
    body = view[USERBLOCK:]
    header = _MAGIC + b'sha256 %s\nsize %d\n' % (hashlib.sha256(body).hexdigest().encode(),
                                                len(body))
    if any(view[:USERBLOCK]):
        raise ValueError('the user block is not empty (built without userblock_size=%d?)'
                         % USERBLOCK)
    view[:len(header)] = header
    return data


def unseal(data, path):
    """Check a sealed file's bytes; return them or raise :class:`CorruptFile` naming ``path``."""
    head = bytes(data[:USERBLOCK])
    if not head.startswith(_MAGIC):
        if data[:8] == b'\x89HDF\r\n\x1a\n':
            raise CorruptFile('%s: has no checksum (written by an older version of '
                              'theanompi-ext, or by another program)' % path)
        raise CorruptFile('%s: not a sealed theanompi-ext file (%d bytes, the header is '
                          'missing or damaged)' % (path, len(data)))
    m = _HEADER.match(head, len(_MAGIC))
    if not m:
        raise CorruptFile('%s: the checksum header is damaged' % path)
    if any(head[m.end():]):
        raise CorruptFile('%s: the checksum header is damaged' % path)
    want_sha, want_size = m.group(1).decode(), int(m.group(2))
    body = memoryview(data)[USERBLOCK:]
    if len(body) != want_size:
        raise CorruptFile('%s: truncated or extended: %d bytes after the header, the checksum '
                          'was taken over %d' % (path, len(body), want_size))
    got = hashlib.sha256(body).hexdigest()
    if got != want_sha:
        raise CorruptFile('%s: checksum mismatch (sha256 %s..., written as %s...): the file '
                          'is corrupt' % (path, got[:12], want_sha[:12]))
    return data


def read_sealed(path):
    """The verified bytes of the sealed file ``path`` (OSError if unreadable)."""
    with open(path, 'rb') as f:
        data = f.read()
    return unseal(data, path)


def sha256_of(data):
    """Hex SHA-256 of ``data`` (bytes)."""
    return hashlib.sha256(data).hexdigest()
