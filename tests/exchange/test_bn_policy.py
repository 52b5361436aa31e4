"""What the exchange sends: never BN statistics; gamma/beta only on request."""
import numpy as np

from theanompi_ext.collective.local import LocalCommunicator
from theanompi_ext.data.digits import load_digits
from theanompi_ext.model import build_model
from theanompi_ext.params import tags_of
from theanompi_ext.train.config import TrainConfig
from theanompi_ext.train.trainer import Trainer


class RecordingComm(LocalCommunicator):
    """World of one that remembers which flat-gradient ranges were reduced."""

    def __init__(self):
        self.ranges = []
        self.grads = None

    def start_allreduce(self, buf, name=None):
        if self.grads is not None and np.shares_memory(buf, self.grads):
            off = (buf.__array_interface__['data'][0]
                   - self.grads.__array_interface__['data'][0]) // 4
            self.ranges.append((off, off + buf.size))
        return LocalCommunicator.start_allreduce(self, buf, name)


def sent_names(exchange_bn):
    data = load_digits(train_subset=64)
    net = build_model('digits_cnn', data.input_shape, 10)
    comm = RecordingComm()
    cfg = TrainConfig(batch_per_worker=16, epochs=2, warmup='none', exchange_bn=exchange_bn,
                      max_steps=2, quiet=True, eval_every=100)
    tr = Trainer(net, data, cfg, comm)
    comm.grads = tr.grads
    stats_before = [s.get_value().copy() for s in net.stats]
    tr.train()
    covered = np.zeros(tr.layout.total, bool)
    for a, b in comm.ranges:
        covered[a:b] = True
    names = set()
    for i, name in enumerate(tr.layout.names):
        sl = covered[tr.layout.slice(i)]
        assert sl.all() or not sl.any(), 'parameter %s partly sent' % name
        if sl.all():
            names.add(name)
    # BN running statistics changed (per-worker state) but are not trainable
    assert any(not np.allclose(a, s.get_value()) for a, s in zip(stats_before, net.stats))
    stat_names = {s.name for s in net.stats}
    assert not stat_names & set(tr.layout.names)
    bn_affine = {p.name for p in net.params if 'bn_affine' in tags_of(p)}
    others = {p.name for p in net.params} - bn_affine
    return names, bn_affine, others


def test_default_policy_never_sends_bn_parameters_or_statistics():
    names, bn_affine, others = sent_names(False)
    assert names == others and not names & bn_affine


def test_exchange_bn_option_sends_gamma_beta_not_statistics():
    names, bn_affine, others = sent_names(True)
    assert names == others | bn_affine


def test_bn_parameters_recognised_by_tag_not_name():
    from theanompi_ext.model.layers import BatchNorm
    bn = BatchNorm('norm', 4)
    bn.gamma.name, bn.beta.name = 'scale_0', 'shift_0'   # names say nothing
    assert 'bn_affine' in tags_of(bn.gamma) and 'bn_affine' in tags_of(bn.beta)
    assert 'bn_stat' in tags_of(bn.mean) and 'trainable' not in tags_of(bn.mean)


def test_local_bn_gradient_steps_with_worker_mean():
    """Under the default policy the unsent gamma/beta gradient is multiplied by k:
    the exchange leaves the local tail alone, the kn rule's update scales it."""
    from theanompi_ext.exchange.knsum import KnSumExchanger
    from theanompi_ext.buckets.plan import plan_buckets
    from theanompi_ext.update.momentum import Optimizer
    from theanompi_ext.update.rules import KnRule
    g = np.array([1, 1, 1, 0.5, 0.25], np.float32)
    ex = KnSumExchanger(LocalCommunicator(), plan_buckets([2, 1, 2], 2), 3)
    ex.reduce(g)
    np.testing.assert_array_equal(g, [1, 1, 1, 0.5, 0.25])
    # momentum 0, no decay, lr 1: the step is the scaled gradient itself
    w = np.zeros(5, np.float32)
    KnRule(Optimizer(5, 0.0, 'eq9', False, 0.0), 3, 4).update(w, g, 1.0)
    np.testing.assert_array_equal(g, [1, 1, 1, 2.0, 1.0])
    np.testing.assert_array_equal(w, [-1, -1, -1, -2.0, -1.0])
