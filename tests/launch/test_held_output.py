"""The job's lines wait for a reader that does not keep up; the copy never blocks
(launch/held_output.py). A real job whose output is not read for longer than its
step timeout: tests/launch/test_stop_and_disk.py::test_output_not_read_for_a_while."""
import fcntl
import io
import os
import re
import threading

import pytest

from theanompi_ext.errors import BadInput
from theanompi_ext.launch.held_output import HeldOutput, hold_bytes

NOTE = re.compile(r"theanompi-ext: (\d+) lines? \((\d+ (?:bytes|kB|MB))\) of the job's (.+?) "
                  r"(?:was|were) dropped here over \d+ s: it was not read as fast as the job "
                  r"wrote \((\d+ (?:bytes|kB|MB)) waited\); the job went on")


def size_of(text):
    """'593 kB' -> (593, 1000): the number and its unit's bytes."""
    n, unit = text.split()
    return int(n), {'bytes': 1, 'kB': 1000, 'MB': 10 ** 6}[unit]


@pytest.fixture
def unread_pipe():
    """(a file writing into a pipe of one page that nobody reads yet, its read end)."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    dest = os.fdopen(w, 'wb', buffering=0)
    reader = os.fdopen(r, 'rb')
    yield dest, reader
    dest.close()
    reader.close()


def put_all(held, lines, within=30):
    """Every line put, from a thread: put must return although nobody reads."""
    t = threading.Thread(target=lambda: [held.put(x) for x in lines], daemon=True)
    t.start()
    t.join(within)
    assert not t.is_alive(), 'put blocked on a reader that does not read'


def lines_of(n, start=0):
    return [b'line %06d of the job\n' % i for i in range(start, start + n)]   # 21 bytes


def read_back(held, reader):
    held.end()
    out = []
    t = threading.Thread(target=lambda: out.append(reader.read()), daemon=True)
    t.start()
    assert held.join(30)
    held.dest.close()
    t.join(30)
    return out[0].decode().splitlines(keepends=True)


def check_gaps(text, sent):
    """Every line sent is either in ``text`` in order, or counted by the note that
    stands where it is missing; (lines written, lines dropped)."""
    i = written = dropped = 0
    for line in text:
        m = NOTE.match(line)
        if m:
            n, (size, unit) = int(m.group(1)), size_of(m.group(2))
            assert round(sum(len(x) for x in sent[i:i + n]) / unit) == size, line
            i += n
            dropped += n
            continue
        assert line.encode() == sent[i], (line, sent[i])
        i += 1
        written += 1
    assert i == len(sent)
    return written, dropped


def test_nothing_waits_for_a_reader_that_keeps_up(unread_pipe):
    dest, reader = unread_pipe
    held = HeldOutput(dest, hold=10 ** 6)
    sent = lines_of(500)
    put_all(held, sent)
    text = read_back(held, reader)
    assert text == [x.decode() for x in sent]            # 10 kB: all of it waited


def test_lines_past_the_hold_are_dropped_and_said_where_they_were(unread_pipe):
    """Nobody reads while 5,000 lines (105 kB) are put: the pipe's page and the hold
    (1,000 bytes) take some, the rest are dropped; once read, each line is there in
    order or counted by the note in its place, and the bytes that waited are bounded."""
    dest, reader = unread_pipe
    held = HeldOutput(dest, hold=1000)
    sent = lines_of(5000)
    put_all(held, sent)
    assert held._bytes <= 1000 + 21
    text = read_back(held, reader)
    written, dropped = check_gaps(text, sent)
    notes = [NOTE.match(x) for x in text if NOTE.match(x)]
    assert len(notes) == 1 and notes[0].group(3) == 'its file', text[-3:]
    assert notes[0].group(4) == '1000 bytes'
    # what got through: at most the pipe's page and the hold (each line whole)
    assert written * 21 <= 4096 + 1000 + 21 and dropped >= 5000 - (4096 + 1000) // 21 - 1


def test_once_read_again_lines_flow_with_one_note_per_stall(unread_pipe):
    """Two stalls with reading in between: two notes, each where its lines are
    missing, and the lines put while the reader kept up all there."""
    dest, reader = unread_pipe
    held = HeldOutput(dest, hold=500)
    got = []
    first, middle, last = lines_of(2000), lines_of(50, 2000), lines_of(2000, 2050)
    put_all(held, first)
    # read what is there now, until the writer has caught up (the note written)
    os.set_blocking(reader.fileno(), False)

    def drain():
        while True:
            try:
                chunk = os.read(reader.fileno(), 65536)
            except BlockingIOError:
                return
            got.append(chunk)
    def caught_up():
        while held._waiting:
            drain()
            threading.Event().wait(0.005)
        threading.Event().wait(0.05)
        drain()
    caught_up()
    for line in middle:          # a reader that keeps up: every line waits alone
        held.put(line)
        caught_up()
    put_all(held, last)
    os.set_blocking(reader.fileno(), True)
    text = b''.join(got).decode().splitlines(keepends=True) + read_back(held, reader)
    written, dropped = check_gaps(text, first + middle + last)
    assert sum(bool(NOTE.match(x)) for x in text) == 2
    # the 50 lines put while the reader kept up are all there, between the notes
    body = ''.join(text)
    assert all(x.decode() in body for x in middle)


def test_a_reader_gone_is_said_once_and_everything_is_still_taken():
    r, w = os.pipe()
    os.close(r)
    closed = threading.Event()
    held = HeldOutput(os.fdopen(w, 'wb', buffering=0), hold=100, closed=closed)
    put_all(held, lines_of(1000))
    held.end()
    assert held.join(30) and closed.is_set()


def test_a_full_disk_drops_the_lines_after_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr('sys.stderr', open(str(tmp_path / 'err'), 'w'))
    with open('/dev/full', 'wb') as full:
        held = HeldOutput(full, hold=100)
        put_all(held, lines_of(1000))
        held.end()
        assert held.join(30)
    err = (tmp_path / 'err').read_text()
    assert err.count("could not write the job's output to /dev/full ([Errno 28] No space "
                     "left on device): its lines are dropped from here; the job goes on") == 1


def test_a_text_destination_gets_the_lines_decoded():
    dest = io.StringIO()
    held = HeldOutput(dest, hold=100)
    held.put('é\n'.encode())
    held.put(b'\xff\n')
    held.end()
    assert held.join(30)
    assert dest.getvalue() == 'é\n\ufffd\n'


@pytest.mark.parametrize('text', ['0', '-1', 'x', 'inf', 'nan'])
def test_a_bad_hold_is_refused_by_name(text):
    with pytest.raises(BadInput, match=r"THEANOMPI_EXT_OUTPUT_HOLD_MB='%s': not a number of "
                                       r"megabytes > 0" % re.escape(text)):
        hold_bytes({'THEANOMPI_EXT_OUTPUT_HOLD_MB': text})


def test_the_hold_in_megabytes():
    assert hold_bytes({}) == 16 * 10 ** 6
    assert hold_bytes({'THEANOMPI_EXT_OUTPUT_HOLD_MB': '0.5'}) == 500000
