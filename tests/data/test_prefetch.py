"""Background prefetcher: order, wait accounting, errors, shutdown."""
import gc
import threading
import time

import numpy as np
import pytest

from theanompi_ext.data.prefetch import Prefetcher


def _batch(idx):
    idx = np.asarray(idx)
    return idx * 10, idx


def _chunks(n, size=2):
    return [np.arange(i, i + size) for i in range(0, n, size)]


def _endless(size=2):
    i = 0
    while True:
        yield np.arange(i, i + size)
        i += size


def _run_with_timeout(fn, timeout=5.0):
    """Run ``fn`` in a thread; fail (instead of hanging) if it takes too long."""
    box = {}

    def target():
        try:
            box['value'] = fn()
        except BaseException as exc:
            box['error'] = exc
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), 'timed out after %.1f s' % timeout
    if 'error' in box:
        raise box['error']
    return box.get('value')


def test_order_and_count():
    def consume():
        with Prefetcher(_batch, _chunks(20), depth=3) as pf:
            got = [(x.copy(), y.copy()) for x, y in pf]
            return got, pf.count
    got, count = _run_with_timeout(consume)
    assert count == 10
    for (x, y), idx in zip(got, _chunks(20)):
        np.testing.assert_array_equal(y, idx)
        np.testing.assert_array_equal(x, idx * 10)
    assert len(got) == 10


def test_wait_accounting():
    def slow(idx):
        time.sleep(0.05)
        return idx

    def consume():
        pf = Prefetcher(slow, range(6), depth=2)
        list(pf)
        return pf
    pf = _run_with_timeout(consume)
    # A consumer doing no work waits for (almost) all of the producer's time.
    assert 0.2 <= pf.wait_s <= 2.0
    assert pf.count == 6 and pf.fetch_s >= 0.25
    assert pf.mean_wait_s == pytest.approx(pf.wait_s / 6)

    def consume_slowly():
        pf = Prefetcher(_batch, _chunks(8), depth=2)
        for _ in pf:
            time.sleep(0.05)  # the "training step" is slower than the data
        return pf
    pf = _run_with_timeout(consume_slowly)
    assert pf.wait_s < 0.15 and pf.count == 4


def test_exception_propagates():
    def bad(idx):
        if idx == 3:
            raise KeyError('batch three is broken')
        return idx

    def consume():
        got = []
        pf = Prefetcher(bad, range(10))
        with pytest.raises(KeyError, match='batch three is broken'):
            for item in pf:
                got.append(item)
        assert list(pf) == []  # finished after the error
        return got, pf
    got, pf = _run_with_timeout(consume)
    assert got == [0, 1, 2] and pf.count == 3
    _run_with_timeout(lambda: pf._thread.join(2.0))
    assert not pf.alive


def test_exception_in_index_iterator():
    def indices():
        yield 0
        raise RuntimeError('sampler failed')

    def consume():
        pf = Prefetcher(lambda i: i, indices())
        assert next(pf) == 0
        with pytest.raises(RuntimeError, match='sampler failed'):
            next(pf)
    _run_with_timeout(consume)


def test_close_early_without_hang():
    def consume():
        pf = Prefetcher(_batch, _endless(), depth=2)
        next(pf)
        t0 = time.perf_counter()
        assert pf.close(timeout=2.0)
        assert time.perf_counter() - t0 < 2.0
        assert not pf.alive
        assert list(pf) == []
        pf.close()  # idempotent
    _run_with_timeout(consume)


def test_close_while_batch_fn_blocks():
    release = threading.Event()

    def blocking(idx):
        release.wait(5)
        return idx

    def consume():
        pf = Prefetcher(blocking, range(100))
        assert pf.close(timeout=0.1) is False  # still inside batch_fn, not interrupted
        release.set()
        pf._thread.join(2.0)
        return pf
    pf = _run_with_timeout(consume)
    assert not pf.alive


def test_garbage_collection_stops_worker():
    def consume():
        pf = Prefetcher(_batch, _endless(), depth=1)
        for _ in pf:
            break  # early exit from the loop, then the object is dropped
        thread = pf._thread
        del pf
        gc.collect()
        thread.join(2.0)
        return thread
    thread = _run_with_timeout(consume)
    assert not thread.is_alive()


def test_bad_depth():
    with pytest.raises(ValueError):
        Prefetcher(_batch, [], depth=0)
