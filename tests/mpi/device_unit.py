"""Device checks in one process on the OpenCL device (argv[1], e.g. opencl0:0).

Prints one ``OK <name>`` line per check; any failure raises (non-zero exit).
Run by tests/test_device.py; the device update, buckets as views, and the
NCCL layer's answers for OpenCL arrays.
"""
import sys

import numpy as np

from theanompi_ext.engine.devices import configure

configure(sys.argv[1])
from theanompi_ext.engine import core as engine  # noqa: E402  (after configure)
from theanompi_ext.params import ParamLayout  # noqa: E402
from theanompi_ext.buckets.plan import plan_buckets  # noqa: E402
from theanompi_ext.params.device import DeviceGradients, view_offset  # noqa: E402
from theanompi_ext.update.device import DeviceOptimizer  # noqa: E402
from theanompi_ext.update.momentum import FORMS, Optimizer  # noqa: E402

assert engine.on_device() and engine.device() == sys.argv[1]


def check_update():
    """Device update == numpy update, every form, Nesterov or not, BN decay/scale tails."""
    rng = np.random.RandomState(0)
    size, tail = 300, 40               # the last 40 entries: local BN gamma/beta
    decay = np.full(size, 1e-4, np.float32)
    decay[-tail:] = 0                   # no weight decay on BN gamma/beta
    scale = np.ones(size, np.float32)
    scale[-tail:] = 4.0                 # k: their local gradient is the worker's n-mean
    lrs = [0.01, 0.02, 0.04, 0.04, 0.004]   # warm-up, then a decay step
    for form in FORMS:
        for nesterov in (False, True):
            w0 = rng.randn(size).astype(np.float32)
            ref_w = w0.copy()
            ref = Optimizer(size, 0.9, form, nesterov, decay)
            flat = engine.shared(w0.copy(), name='w')
            dev = DeviceOptimizer(flat, 0.9, form, nesterov, decay, scale)
            for lr in lrs:
                g = rng.randn(size).astype(np.float32)
                gs = g.copy()
                gs[-tail:] *= np.float32(4.0)
                ref.step(ref_w, gs, lr)
                dg = engine.device_zeros(size)
                dg.write(g)
                dev.step(dg, lr)
            got = np.asarray(flat.get_value())
            vel = dev.state()['velocity']
            np.testing.assert_allclose(got, ref_w, rtol=2e-6, atol=2e-7,
                                       err_msg='%s nesterov=%s' % (form, nesterov))
            np.testing.assert_allclose(vel, ref.velocity, rtol=2e-6, atol=2e-7)
            assert not np.array_equal(got, w0)
            assert engine.device_value(flat) is not None
    print('OK update')


def check_bucket_views():
    """Buckets and per-parameter gradients are views of the flat device buffer."""
    layout = ParamLayout([('a', (50, 30), 'float32'), ('b', (30,), 'float32'),
                          ('c', (20, 10), 'float32'), ('d', (10,), 'float32')])
    grads = DeviceGradients(layout)
    buckets = plan_buckets(layout.sizes, len(layout), 0.004, 0.002)
    assert len(buckets) >= 2, buckets
    for b in buckets:
        assert view_offset(grads.bucket(b), grads.flat) == b.start, b
    assert any(b.start > 0 for b in buckets)
    for i in range(len(layout)):
        v = grads.view(i)
        assert view_offset(v, grads.flat) == layout.offsets[i]
        v[...] = np.full(layout.shapes[i], i + 1, np.float32)   # write through the view
    host = np.asarray(grads.flat)
    for i in range(len(layout)):
        assert np.all(host[layout.slice(i)] == i + 1)
    print('OK views')


def check_nccl_answers():
    """The NCCL layer answers for an OpenCL array (no pygpu TypeError leaks)."""
    from theanompi_ext.collective.nccl_buffers import device_buffer, is_device_array
    a = engine.device_zeros(8)[2:6]
    assert is_device_array(a) is False
    try:
        device_buffer(a)
    except TypeError as exc:
        assert 'opencl context; NCCL needs CUDA' in str(exc), exc
    else:
        raise AssertionError('device_buffer accepted an OpenCL array')
    print('OK nccl')


check_update()
check_bucket_views()
check_nccl_answers()
