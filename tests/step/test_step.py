"""The one step (theanompi_ext/step/): what every face runs, in which order.

The step is assembled once and run by the trainer and the Theano-MPI
stepper alike: the watchdog armed for the iteration, the loss statistics
and the finiteness rule (one error class), only the step starting and
finishing the exchange, the rule's update, the timeline.
"""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from support.paths import ROOT
from theanompi_ext.collective.local import LocalCommunicator
from theanompi_ext.errors import NonFiniteLoss, NonFiniteStep

DROPIN = os.path.join(ROOT, 'tests', 'dropin')


class Events(LocalCommunicator):
    """One rank that records the step's collectives and the watchdog's arming in order."""

    def __init__(self):
        LocalCommunicator.__init__(self)
        self.events = []

    def arm(self, step):
        self.events.append('arm %d' % step)

    def disarm(self):
        self.events.append('disarm')

    def allreduce(self, buf, op='sum', label=None):
        self.events.append('allreduce %s' % label)
        return LocalCommunicator.allreduce(self, buf, op)

    def start_allreduce(self, buf, name=None, wire='float32'):
        self.events.append('start %s' % name)
        return LocalCommunicator.start_allreduce(self, buf, name)


class FixedBackward(object):
    """Writes a fixed gradient (reporting each parameter final in turn) and a loss."""

    def __init__(self, grad, loss=1.5, err=0.5):
        self.grad, self.loss, self.err = np.asarray(grad, np.float32), loss, err

    def run(self, x, y, grads, layout, on_chunk=None):
        grads[...] = self.grad
        if on_chunk is not None:
            for i in range(len(layout)):
                on_chunk(i, i + 1)
        return self.loss, self.err


def parts_of(sync_type='kn', exch_strategy='ar'):
    """Assembled parts of three parameters: W (4), b (2), and a local BN gamma (2)."""
    from theanompi_ext.engine.core import shared
    from theanompi_ext.params import tag
    from theanompi_ext.step.assemble import assemble_step
    w = tag(shared(np.ones(4, np.float32), name='W'), 'trainable')
    b = tag(shared(np.ones(2, np.float32), name='b'), 'trainable', 'bias')
    g = tag(shared(np.ones(2, np.float32), name='gamma'), 'trainable', 'bn_affine')
    settings = SimpleNamespace(sync_type=sync_type, exch_strategy=exch_strategy,
                               exchange_bn=False, wire_dtype='float32',
                               bucket_cap_mb=16 / 2 ** 20, first_bucket_cap_mb=16 / 2 ** 20,
                               weight_decay=0.0, momentum=0.0, momentum_form='eq9',
                               nesterov=False)
    variables = [w, b, g]
    comm = Events()
    from theanompi_ext.params import tags_of
    return comm, assemble_step(comm, variables, [tags_of(v) for v in variables], settings,
                               local_scale=4)


def make_step(grad, overlapped, sync_type='kn', timeline=None, **backward_kw):
    from theanompi_ext.step.run import Step
    comm, parts = parts_of(sync_type, 'ar-overlap' if overlapped else 'ar')
    comm.events[:] = []                              # the assembly's own checks
    return comm, parts, Step(comm, parts, FixedBackward(grad, **backward_kw), overlapped,
                             iters_per_epoch=10, timeline=timeline)


@pytest.mark.parametrize('overlapped', [False, True])
def test_step_order_and_update(overlapped):
    from theanompi_ext.exchange.timeline import Timeline
    # flat order: exchanged reversed (b, W), then the local gamma
    grad = np.array([1, 2, 3, 4, 5, 6, 7, 8], np.float32)
    comm, parts, step = make_step(grad, overlapped, timeline=Timeline(0))
    assert parts.layout.names == ['b', 'W', 'gamma'] and parts.n_exch == 6
    out = step.run(None, None, 0.5, 12, 4)
    buckets = ['start bucket%d' % b.index for b in parts.buckets]
    if overlapped:       # buckets start during the backward, before the loss statistics
        assert comm.events == ['arm 12'] + buckets + ['allreduce loss stats', 'disarm']
    else:                # the serial exchange after them, by the step (not the rule)
        assert comm.events == ['arm 12', 'allreduce loss stats'] + buckets + ['disarm']
    # momentum 0, lr 0.5: w = 1 - 0.5 g; the local tail's gradient x k (= 4)
    want = 1 - 0.5 * grad * np.array([1] * 6 + [4] * 2, np.float32)
    np.testing.assert_array_equal(parts.params.values, want)
    assert (out.loss_sum, out.err_sum, out.count) == (1.5, 0.5, 4.0)
    assert (out.local_loss, out.local_err) == (1.5, 0.5)
    assert len(step.timeline.steps) == 1 and step.timeline.steps[0].iteration == 12


@pytest.mark.parametrize('overlapped', [False, True])
@pytest.mark.parametrize('where,needle', [
    ('loss', r'non-finite loss \(nan\) at iteration 23 \(epoch 2\)'),
    ('exchanged', r'non-finite gradient on 1 of 1 ranks \(loss 1.5\) at iteration 23 '
                  r'\(epoch 2\)'),
    ('local', r'non-finite gradient on 1 of 1 ranks'),
])
def test_nonfinite_stops_before_the_update(overlapped, where, needle):
    grad = np.ones(8, np.float32)
    kw = {}
    if where == 'loss':
        kw['loss'] = float('nan')
    else:
        grad[1 if where == 'exchanged' else 7] = np.inf
    comm, parts, step = make_step(grad, overlapped, **kw)
    before = parts.params.values.copy()
    with pytest.raises(NonFiniteLoss, match=needle):
        step.run(None, None, 0.5, 23, 4)
    np.testing.assert_array_equal(parts.params.values, before)     # nothing updated
    assert parts.exchanger._started == []                          # every start waited
    assert NonFiniteStep is NonFiniteLoss                           # one error class


def test_a_finite_step_after_a_refused_one():
    grad = np.ones(8, np.float32)
    grad[0] = np.nan
    comm, parts, step = make_step(grad, True)
    with pytest.raises(NonFiniteLoss):
        step.run(None, None, 0.5, 0, 4)
    step.backward.grad[0] = 1.0
    step.run(None, None, 0.5, 1, 4)      # the check starts over each step
    np.testing.assert_array_equal(parts.params.values, 1 - 0.5 * np.array([1] * 6 + [4] * 2))


def test_rules_only_update():
    """avg and cdd exchange no gradient (their sums are part of their update);
    kn's gradient exchange is the step's, not the rule's."""
    from theanompi_ext.update import rules
    assert rules.KnRule.exchanges_gradient
    assert not rules.AvgRule.exchanges_gradient and not rules.CddRule.exchanges_gradient
    for cls in (rules.KnRule, rules.DeviceKnRule, rules.AvgRule, rules.CddRule):
        assert not hasattr(cls, 'step') and hasattr(cls, 'update')
    # the avg step through the Step: no bucket started
    comm, parts, step = make_step(np.ones(8, np.float32), False, sync_type='avg')
    step.run(None, None, 0.5, 0, 4)
    assert not any(e.startswith('start') for e in comm.events)
    with pytest.raises(ValueError, match="unknown sync_type 'asgd'"):
        rules.make_rule('asgd', comm, parts.layout, 6, [()] * 3, None, 1)


def test_contract_face_arms_the_watchdog_and_keeps_the_timeline(tmp_path):
    """The Theano-MPI face runs the same step: 2 ranks through the session launcher
    with TIMELINE set write the timeline of every step of both ranks."""
    cfg = tmp_path / 'session.cfg'
    prefix = tmp_path / 'tl'
    cfg.write_text('RULE=BSP\nMODELFILE=digits_contract\nMODELCLASS=DigitsMLPLayered\n'
                   'DEVICES=cpu0,cpu1\nSYNC_TYPE=kn\nEXCH_STRATEGY=ar-overlap\n'
                   'MAX_STEPS=3\nTIMELINE=%s\nCOLLECTIVE_TIMEOUT_S=60\n' % prefix)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([DROPIN, ROOT]))
    res = subprocess.run([sys.executable, '-m', 'theanompi_ext.tmlauncher', '-cfg=%s' % cfg],
                         cwd=DROPIN, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    trace = json.load(open(str(prefix) + '.json'))
    spans = [e for e in trace['traceEvents'] if e.get('ph') == 'X']
    for rank in (0, 1):      # every step of both ranks: its loss statistics and buckets
        mine = [e for e in spans if e['pid'] == rank]
        assert sum(e['name'] == 'stats' for e in mine) == 3, mine
        assert any(e['name'].startswith('bucket') for e in mine)
    assert os.path.exists(str(prefix) + '.png')


def test_contract_stepper_comm_is_watched():
    from theanompi_ext.collective import create_communicator
    from theanompi_ext.collective.watchdog import WatchedCommunicator
    from theanompi_ext.theanompi_compat.options import resolve_options
    from theanompi_ext.theanompi_compat.stepper import ContractStepper
    sys.path.insert(0, DROPIN)
    import digits_contract as dc
    model = dc.DigitsMLPLayered({'verbose': False, 'rank': 0, 'size': 1})
    opts = resolve_options(model, environ={'THEANOMPI_EXT_COLLECTIVE_TIMEOUT_S': '7',
                                           'THEANOMPI_EXT_TIMELINE': 'x'})
    st = ContractStepper(model, create_communicator('local'), 'kn', opts, log=lambda *a: None,
                         overlap=True)
    assert isinstance(st.comm, WatchedCommunicator)
    assert st.comm.watchdog.timeout_s == 7.0
    armed = []
    st.comm.watchdog.arm = lambda it, _arm=st.comm.watchdog.arm: (armed.append(it), _arm(it))
    for i in range(2):
        model.load_train_batch(i)
        st.step()
    assert armed == [0, 1] and not st.comm.watchdog.armed
    assert [s.iteration for s in st.timeline.steps] == [0, 1]
