"""Pipes whose reader stopped reading: what a paused terminal or pager looks like."""
import fcntl
import os


def full_pipe(size=4096):
    """(read end, write end) of a pipe of ``size`` bytes, filled: a write to it
    blocks until the read end is read."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, size)
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b'x' * 512)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w
