"""The Communicator interface on every backend, and the handle discipline.

MPI for real at 2 and 3 ranks (tests/mpi/run_communicator.py: reduce ops
against numpy, labels, the bounded barrier timing out when a rank is late,
wait timeouts in both progress modes); the local backend in process; NCCL
and pygpu against the fakes of test_nccl.py; the exchanger's and the
trainer's error paths with recording handles; and a static check that
nothing outside collective/ and launch/ imports mpi4py.
"""
import ast
import inspect
import os
import time

import numpy as np
import pytest

from theanompi_ext.collective import CollectiveTimeout, registry
from theanompi_ext.collective.base import Handle, wait_all
from theanompi_ext.collective.local import LocalCommunicator
from theanompi_ext.collective.mpi import MPICommunicator
from theanompi_ext.collective.nccl import NCCLCommunicator
from theanompi_ext.collective.pygpu_nccl import PygpuNCCLCommunicator
from theanompi_ext.collective.watchdog import WatchedCommunicator, WatchedHandle, watch
from theanompi_ext.exchange.knsum import IncompleteExchange, KnSumExchanger

from support.fakes import FakeCupyArray, FakeGpuArray, FakeGpuComm, FakeMPIComm, make_comm
from support.paths import ROOT
from support.procs import run_mpi_json

PACKAGE = os.path.join(ROOT, 'theanompi_ext')


# -- MPI, several ranks ---------------------------------------------------------------

@pytest.mark.parametrize('ranks', [2, 3])
def test_mpi_interface_at_world_sizes(ranks):
    out = run_mpi_json(ranks, 'run_communicator.py', timeout=120)
    assert out['size'] == ranks
    for progress in ('thread', 'request'):
        # the early ranks gave up after the 0.5 s limit, not before, not much later
        assert 0.5 <= out[progress]['barrier_s'] < 1.5, out
        assert 0.3 <= out[progress]['wait_s'] < 1.3, out


# -- the interface, as signatures and in process --------------------------------------

BACKEND_CLASSES = [LocalCommunicator, MPICommunicator, NCCLCommunicator, PygpuNCCLCommunicator,
                   WatchedCommunicator]


@pytest.mark.parametrize('cls', BACKEND_CLASSES, ids=lambda c: c.__name__)
def test_every_backend_has_the_interface(cls):
    def params(name):
        return inspect.signature(getattr(cls, name)).parameters
    assert {'op', 'label'} <= set(params('allreduce'))
    assert params('allreduce')['op'].default == 'sum'
    assert {'name', 'wire'} <= set(params('start_allreduce'))
    assert {'timeout_s', 'label'} <= set(params('barrier'))
    assert 'label' in params('allgather') and 'label' in params('bcast')


def test_local_backend():
    comm = LocalCommunicator()
    buf = np.array([3, -1, 2], np.float32)
    for op in ('sum', 'max', 'min'):
        assert comm.allreduce(buf, op=op, label='x') is buf    # world of one: identity
    np.testing.assert_array_equal(buf, [3, -1, 2])
    with pytest.raises(ValueError, match="unknown reduce op 'avg'"):
        comm.allreduce(buf, op='avg')
    assert comm.allgather(1, label='x') == [1] and comm.bcast(2, label='x') == 2
    comm.barrier(timeout_s=0.1, label='x')
    with pytest.raises(ValueError, match='timeout_s must be None'):
        comm.barrier(timeout_s=-1)
    h = comm.start_allreduce(buf, name='b')
    assert h.wait(timeout=0.1) is buf
    with pytest.raises(ValueError, match='timeout must be None'):
        h.wait(timeout=0)


def test_nccl_ops_and_labels_on_fakes():
    from theanompi_ext.collective import nccl_lib
    comm, cuda, lib, _ = make_comm()
    for op, code in (('sum', nccl_lib.NCCL_SUM), ('max', nccl_lib.NCCL_MAX),
                     ('min', nccl_lib.NCCL_MIN)):
        buf = FakeCupyArray()
        assert comm.allreduce(buf, op=op, label='stats') is buf
        assert lib.log[-1][5] == code and cuda.log[-1][0] == 'event_sync'
    with pytest.raises(ValueError, match="unknown reduce op 'prod'"):
        comm.allreduce(FakeCupyArray(), op='prod')
    comm.barrier(timeout_s=1, label='x')        # a world of one
    assert comm.allgather('a', label='x') == ['a'] and comm.bcast('b', label='x') == 'b'


def test_pygpu_ops_labels_and_refused_timeout():
    class OpsGpuComm(FakeGpuComm):
        def all_reduce(self, src, op, dest=None):
            self.calls.append((src, op, dest))
    gpucomm = OpsGpuComm(count=2)
    comm = registry.create_communicator('pygpu-nccl', gpucomm=gpucomm, comm=FakeMPIComm(size=2))
    assert comm.name == 'pygpu-nccl'
    for op, theirs in (('sum', '+'), ('max', 'max'), ('min', 'min')):
        buf = FakeGpuArray(np.arange(4, dtype=np.float32))
        comm.allreduce(buf, op=op, label='x')
        assert gpucomm.calls[-1] == (buf, theirs, buf) and buf.synced == 1
    h = comm.start_allreduce(FakeGpuArray(np.ones(2, np.float32)), 'b0')
    with pytest.raises(ValueError, match='cannot be waited for with a timeout'):
        h.wait(timeout=1.0)
    with pytest.raises(ValueError, match="needs gpucomm="):
        registry.create_communicator('pygpu-nccl')


def test_registry_names_every_backend(monkeypatch):
    assert set(registry.BACKENDS) == {'local', 'mpi', 'nccl', 'pygpu-nccl'}
    assert set(registry.backend_names()) == set(registry.BACKENDS) | {'auto'}
    assert registry.host_backends() == ('auto', 'local', 'mpi')
    assert [row[0] for row in registry.available_backends()] == ['local', 'mpi', 'nccl',
                                                                 'pygpu-nccl']
    with pytest.raises(registry.BackendRefused, match="unknown collective backend 'gloo'"):
        registry.create_communicator('gloo')
    monkeypatch.setenv('PMI_RANK', '1')
    monkeypatch.setenv('PMI_SIZE', '2')
    with pytest.raises(registry.BackendRefused, match="rank 1 of an MPI job of 2"):
        registry.create_communicator('local')
    from theanompi_ext.errors import exit_status, EXIT_BAD_INPUT
    assert exit_status(registry.BackendRefused('x')) == EXIT_BAD_INPUT


def test_backend_is_a_training_option():
    from theanompi_ext.train.config import TrainConfig
    from theanompi_ext.train.options import build_parser
    assert TrainConfig().validate().backend == 'auto'
    assert TrainConfig(backend='mpi').validate().backend == 'mpi'
    with pytest.raises(ValueError, match=r"backend='nccl'.*nccl sums device arrays"):
        TrainConfig(backend='nccl').validate()
    with pytest.raises(ValueError, match=r"backend='gloo': choose from"):
        TrainConfig(backend='gloo').validate()
    parser = build_parser()
    assert parser.parse_args(['--backend', 'local']).backend == 'local'
    with pytest.raises(SystemExit):
        parser.parse_args(['--backend', 'nccl'])


# -- handles ------------------------------------------------------------------------

def test_unfinished_handle_wait_honours_its_timeout():
    h = Handle(np.zeros(2, np.float32), 'stuck')
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout, match="'stuck' did not finish within 0.1 s"):
        h.wait(timeout=0.1)
    assert 0.1 <= time.monotonic() - t0 < 1.0
    with pytest.raises(ValueError, match='timeout must be None'):
        h.wait(timeout=-2)


class FakeNCCLHandle(object):
    """An NCCL-like handle: ``wait(timeout, sync)``; records how it was waited for."""

    def __init__(self, dog=None):
        self.waits, self.dog = [], dog
        self.buf, self.name, self.t_start = 'buf', 'b0', 1.5

    def wait(self, timeout=None, sync=None):
        self.waits.append((timeout, sync, self.dog._state[2] if self.dog else None))
        return self.buf


class FakeBackend(LocalCommunicator):
    name = 'fake'

    def __init__(self):
        self.handles = []

    def start_allreduce(self, buf, name=None, wire='float32'):
        self.handles.append(FakeNCCLHandle())
        return self.handles[-1]


def test_watched_handle_is_a_wrapper_passing_sync_through():
    inner = FakeBackend()
    comm = watch(inner, timeout_s=30.0, stall_warn_s=10.0)
    h = comm.start_allreduce(np.zeros(4, np.float32), 'bucket7')
    raw = inner.handles[-1]
    raw.dog = comm.watchdog
    assert isinstance(h, WatchedHandle) and 'wait' not in vars(raw)   # nothing patched
    comm.arm(3)
    assert h.wait(sync=True) == 'buf'
    assert h.wait(0.5, sync=False) == 'buf'
    comm.disarm()
    # sync= and the timeout reach NCCL's wait, inside a watched wait labelled by the bucket
    assert raw.waits == [(None, True, 'bucket7'), (0.5, False, 'bucket7')]
    assert h.t_start == 1.5 and h.name == 'b0'             # the rest is the inner handle's


class Recorded(object):
    """A handle that records its waits (optionally failing)."""

    def __init__(self, name, fail=False):
        self.name, self.fail, self.waited = name, fail, 0

    def wait(self, timeout=None):
        self.waited += 1
        if self.fail:
            raise RuntimeError('%s failed' % self.name)


class Recording(LocalCommunicator):
    def __init__(self):
        self.handles = []

    def start_allreduce(self, buf, name=None, wire='float32'):
        self.handles.append(Recorded(name))
        return self.handles[-1]


def _exchanger(n_params=3):
    from theanompi_ext.buckets.plan import plan_buckets
    # 4-entry tensors, 16-byte caps: one parameter per bucket
    buckets = plan_buckets([4] * n_params, n_params, cap_mb=16 / 2 ** 20,
                           first_cap_mb=16 / 2 ** 20)
    comm = Recording()
    return KnSumExchanger(comm, buckets, 4 * n_params), comm


def test_finish_refuses_a_plan_not_all_started():
    ex, comm = _exchanger(3)
    grads = np.ones(12, np.float32)
    ex.start(0, grads)
    ex.start(2, grads)
    with pytest.raises(IncompleteExchange, match=r'bucket1 of the 3 buckets of the plan not '
                                                 r'started \(the 2 started were waited for\)'):
        ex.finish(grads)
    assert [h.waited for h in comm.handles] == [1, 1]
    with pytest.raises(ValueError, match='bucket0 started twice'):
        ex.start(0, grads)
        ex.start(0, grads)
    ex.drain()
    ex.reduce(grads)                     # the next step is whole again
    assert all(h.waited == 1 for h in comm.handles)


def test_wait_all_waits_the_rest_when_one_fails():
    hs = [Recorded('a'), Recorded('b', fail=True), Recorded('c')]
    done = []
    with pytest.raises(RuntimeError, match='b failed'):
        wait_all(hs, done.append)
    assert [h.waited for h in hs] == [1, 1, 1] and done == [0]


def test_settling_drains_on_an_error_not_on_an_interrupt():
    ex, comm = _exchanger(3)
    grads = np.ones(12, np.float32)
    with pytest.raises(ZeroDivisionError):
        with ex.settling():
            ex.start_ready(2, grads)
            1 / 0
    assert [h.waited for h in comm.handles] == [1, 1] and ex._started == []
    with pytest.raises(KeyboardInterrupt):
        with ex.settling():
            ex.start_ready(1, grads)
            raise KeyboardInterrupt
    assert comm.handles[-1].waited == 0     # the job is stopping: nothing waits for peers


def test_nonfinite_loss_leaves_no_unwaited_handle(monkeypatch):
    """The trainer's step raises NonFiniteLoss only after every started bucket was waited."""
    from theanompi_ext.data.digits import load_digits
    from theanompi_ext.model import build_model
    from theanompi_ext.train.config import TrainConfig
    from theanompi_ext.errors import NonFiniteLoss
    from theanompi_ext.train.trainer import Trainer

    class NaNBackward(object):
        """Starts every bucket, as the chunked backward does, then reports a NaN loss."""
        def run(self, x, y, grads, layout, on_chunk):
            grads[...] = 1.0
            on_chunk(0, len(layout))
            return float('nan'), 0.0

    monkeypatch.setattr(Trainer, '_build_backward', lambda self, groups: NaNBackward())
    data = load_digits(train_subset=64)
    net = build_model('digits_cnn', data.input_shape, 10)
    comm = Recording()
    cfg = TrainConfig(batch_per_worker=16, epochs=2, warmup='none', quiet=True,
                      exch_strategy='ar-overlap')
    tr = Trainer(net, data, cfg, comm)
    with pytest.raises(NonFiniteLoss, match='non-finite loss'):
        tr.step(np.zeros(1), np.zeros(4))
    assert len(comm.handles) == len(tr.buckets) > 1
    assert all(h.waited == 1 for h in comm.handles)


# -- layering ---------------------------------------------------------------------------

# none: info and bench allreduce's raw-MPI baseline take the module from
# collective/world.import_mpi, as everything else
MPI4PY_EXCEPTIONS = set()


def test_mpi4py_only_behind_the_collective_layer():
    offenders = []
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith('.py'):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, PACKAGE).replace(os.sep, '/')
            if rel.split('/')[0] in ('collective', 'launch') or rel in MPI4PY_EXCEPTIONS:
                continue
            with open(path) as fh:
                tree = ast.parse(fh.read(), path)
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
                if any(n == 'mpi4py' or n.startswith('mpi4py.') for n in names):
                    offenders.append('%s:%d' % (rel, node.lineno))
    assert offenders == []
    # and the check sees imports where they are (the collective layer holds them)
    seen = []
    for f in os.listdir(os.path.join(PACKAGE, 'collective')):
        if f.endswith('.py'):
            with open(os.path.join(PACKAGE, 'collective', f)) as fh:
                tree = ast.parse(fh.read())
            seen += [f for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                     and any(n == 'mpi4py' or n.startswith('mpi4py.') for n in
                             ([a.name for a in node.names] if isinstance(node, ast.Import)
                              else [node.module or '']))]
    assert seen, 'the import walk found no mpi4py import even in collective/'
