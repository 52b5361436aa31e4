"""One vocabulary and one check of sync_type x exch_strategy, held at every entry point;
validation that leaves its input alone; one step assembly with one agreed tuple.

No Theano, no MPI: parameters are numpy-backed stand-ins, the world is the
'local' communicator (or a stand-in that plays another rank's answer).
"""
import argparse
import copy
from types import SimpleNamespace

import numpy as np
import pytest

from theanompi_ext.exchange import modes
from theanompi_ext.train.config import TrainConfig

# (sync_type, exch_strategy): a combination, Theano-MPI-only names, unknown names.
BAD = [('avg', 'ar-overlap'), ('cdd', 'ar-overlap'), ('kn', 'nccl32'), ('kn', 'nccl16'),
       ('kn', 'copper'), ('swap', 'ar'), ('sgd', 'ar')]


def expected(sync_type, exch_strategy):
    with pytest.raises(modes.ModeError) as exc:
        modes.check_mode(sync_type, exch_strategy)
    return exc.value


def assert_same_refusal(message, exp, name=None):
    """The entry point's message says the validator's reason about the same option and value."""
    assert exp.named(name or exp.option) in message, (message, str(exp))


def test_the_validator_itself():
    e = expected('avg', 'ar-overlap')
    assert (e.option, e.value) == ('exch_strategy', 'ar-overlap')
    assert str(e) == ("invalid option exch_strategy='ar-overlap': overlap exists only for "
                      "sync_type=kn, not avg (avg and cdd exchange parameters or momenta after "
                      "the local step)")
    e = expected('kn', 'nccl32')
    assert "Theano-MPI's pygpu NCCL within one node" in str(e) and 'ar, ar-overlap' in str(e)
    assert str(expected('sgd', 'ar')) == "invalid option sync_type='sgd': choose from kn, avg, cdd"
    with pytest.raises(modes.ModeError, match="wire_dtype='bfloat16': a 16-bit wire exists only"):
        modes.check_mode('cdd', 'ar', 'bfloat16')
    # what is allowed
    for s in modes.SYNC_TYPES:
        assert modes.check_mode(s, 'ar') == (s, 'ar', 'float32')
    assert modes.check_mode('kn', 'ar-overlap', 'float16') == ('kn', 'ar-overlap', 'float16')
    assert [modes.default_strategy(s) for s in modes.SYNC_TYPES] == ['ar-overlap', 'ar', 'ar']
    # Theano-MPI's own strategy names name a backend: a separate table
    assert modes.theanompi_backend('ar') == 'mpi'
    with pytest.raises(NotImplementedError, match='nccl16'):
        modes.theanompi_backend('nccl16')


@pytest.mark.parametrize('sync_type,exch', BAD)
def test_train_config_refuses(sync_type, exch):
    with pytest.raises(ValueError) as exc:
        TrainConfig(sync_type=sync_type, exch_strategy=exch).validate()
    assert_same_refusal(str(exc.value), expected(sync_type, exch))


@pytest.mark.parametrize('sync_type,exch', BAD)
def test_train_cli_refuses(sync_type, exch, capsys):
    from theanompi_ext.train.options import build_parser, config_from
    argv = ['--sync-type', sync_type, '--exch-strategy', exch]
    try:
        # a value outside the vocabulary stops argparse (status 2) ...
        config_from(build_parser().parse_args(argv))
    except SystemExit as stop:
        assert stop.code == 2
        message = capsys.readouterr().err
    except ValueError as exc:
        # ... a combination of known values stops validation
        message = str(exc)
    else:
        pytest.fail('%s accepted' % argv)
    assert_same_refusal(message, expected(sync_type, exch))


@pytest.mark.parametrize('sync_type,exch', BAD)
def test_bsp_init_refuses_before_any_rank_starts(sync_type, exch, tmp_path):
    from theanompi_ext import BSP
    model = tmp_path / 'm.py'
    model.write_text('class M(object):\n    pass\n')
    rule = BSP()
    rule.sync_type, rule.exch_strategy = sync_type, exch
    with pytest.raises(ValueError) as exc:
        rule.init(['cpu0', 'cpu1'], str(model), 'M')
    assert rule.proc is None
    assert_same_refusal(str(exc.value), expected(sync_type, exch))


@pytest.mark.parametrize('sync_type,exch', BAD)
def test_session_file_refuses(sync_type, exch, tmp_path):
    from theanompi_ext.theanompi_compat.session import session_from_file
    model = tmp_path / 'm.py'
    model.write_text('class M(object):\n    pass\n')
    cfg = tmp_path / 's.cfg'
    cfg.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=M\nDEVICES=cpu0,cpu1\n'
                   'BSP_SYNC_TYPE=%s\nBSP_EXCH_STRATEGY=%s\n' % (model, sync_type, exch))
    with pytest.raises(ValueError) as exc:
        session_from_file(str(cfg))
    exp = expected(sync_type, exch)
    # the session file's key, as the user wrote it there
    assert str(exc.value).startswith(str(cfg) + ': ')
    assert_same_refusal(str(exc.value), exp, exp.option.upper())


def stub_model(n_params=0):
    """What resolve_options and contract_tags read of a Theano-MPI model."""
    from theanompi_ext.params import tag
    params = [FakeShared('W', (3, 2)), FakeShared('b', (2,)), FakeShared('gamma', (2,)),
              FakeShared('W', (2, 4)), FakeShared('b', (4,))][:n_params]
    for p, tags in zip(params, [(), ('bias',), ('bn_affine',), (), ('bias',)]):
        tag(p, 'trainable', *tags)
    return SimpleNamespace(params=params, weight_types=['W', 'b', 'W', 'W', 'b'][:n_params],
                           batch_size=4, n_epochs=2, base_lr=0.1, eta=1e-4, mu=0.9)


@pytest.mark.parametrize('sync_type,exch', BAD)
def test_theanompi_exchanger_and_contract_worker_refuse(sync_type, exch):
    from theanompi_ext.theanompi_compat.exchanger import BSP_Exchanger
    from theanompi_ext.theanompi_compat.worker import run
    exp = expected(sync_type, exch)
    with pytest.raises(ValueError) as exc:
        BSP_Exchanger(None, None, exch, sync_type, None, stub_model())
    assert_same_refusal(str(exc.value), exp)
    with pytest.raises(ValueError) as exc:
        run('no_such_module', 'M', sync_type, exch, ['cpu0'], comm=object())
    assert_same_refusal(str(exc.value), exp)


def test_contract_stepper_refuses_overlap_without_kn():
    from theanompi_ext.collective.local import LocalCommunicator
    from theanompi_ext.theanompi_compat.options import resolve_options
    from theanompi_ext.theanompi_compat.stepper import ContractStepper
    model = stub_model(5)
    with pytest.raises(ValueError) as exc:
        ContractStepper(model, LocalCommunicator(), 'avg', resolve_options(model, {}),
                        overlap=True)
    assert_same_refusal(str(exc.value), expected('avg', 'ar-overlap'))


def test_validate_leaves_its_input_unchanged():
    cfg = TrainConfig(exch_strategy='', decay_epochs=[5, 8], device=' CPU3 ', epochs=10)
    before = copy.deepcopy(cfg)
    out = cfg.validate()
    assert cfg == before                      # every field, compared by value
    assert out is not cfg
    assert (out.exch_strategy, out.decay_epochs, out.device) == ('ar-overlap', (5, 8), 'cpu')
    assert out.validate() == out              # a normalised config is a fixed point
    bad = TrainConfig(sync_type='avg', exch_strategy='ar-overlap', decay_epochs=[3])
    before = copy.deepcopy(bad)
    with pytest.raises(ValueError):
        bad.validate()
    assert bad == before


# -- one step assembly ------------------------------------------------------------------

class FakeShared(object):
    """A float32 shared variable in memory: what ParamSet reads and binds."""

    def __init__(self, name, shape):
        self.name, self.tag = name, argparse.Namespace()
        self.value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def get_value(self, borrow=False):
        return self.value if borrow else self.value.copy()

    def set_value(self, value, borrow=False):
        self.value = value if borrow else np.array(value)


class Recording(object):
    """A world of one that records what is gathered; ``other`` plays rank 1's
    answer to the plan check (None: a one-rank world)."""

    def __init__(self, other=None):
        from theanompi_ext.collective.local import LocalCommunicator
        self.inner, self.other, self.gathered = LocalCommunicator(), other, []
        self.rank, self.size = 0, 1 if other is None else 2

    def allgather(self, obj, label=None):
        self.gathered.append(obj)
        if self.other is None:
            return [obj]
        if isinstance(obj, tuple) and len(obj) == 3:      # the plan check
            return [obj, (obj[0], self.other, obj[2])]
        return [obj, obj]

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Built(Exception):
    """Stops a constructor right after the assembly (nothing is compiled)."""


@pytest.fixture
def stop_after_assembly(monkeypatch):
    """Record every assemble_step call of the trainer and the contract stepper."""
    from theanompi_ext.step import assemble
    from theanompi_ext.train import trainer
    from theanompi_ext.theanompi_compat import stepper
    calls = []

    def recording(comm, variables, tags, settings, local_scale, names=None):
        parts = assemble.assemble_step(comm, variables, tags, settings, local_scale, names)
        calls.append((comm, parts, local_scale))
        raise Built()
    monkeypatch.setattr(trainer, 'assemble_step', recording)
    monkeypatch.setattr(stepper, 'assemble_step', recording)
    return calls


def trainer_parts(calls, comm, **options):
    from theanompi_ext.train.trainer import Trainer
    model = stub_model(5)
    for i, p in enumerate(model.params):
        p.name = 'layer%d.%s' % (i, p.name)      # our models name every parameter apart
    net = SimpleNamespace(params=model.params)
    with pytest.raises(Built):
        Trainer(net, None, TrainConfig(collective_timeout_s=0, stall_warn_s=0, **options), comm)
    return calls[-1][1]


def contract_parts(calls, comm, sync_type='kn', overlap=False, **options):
    from theanompi_ext.theanompi_compat.options import resolve_options
    from theanompi_ext.theanompi_compat.stepper import ContractStepper
    model = stub_model(5)
    model.tmx_options = options
    with pytest.raises(Built):
        ContractStepper(model, comm, sync_type, resolve_options(model, {}), overlap=overlap)
    return calls[-1][1]


@pytest.mark.parametrize('trainer_kw,contract_kw', [
    (dict(sync_type='kn', exch_strategy='ar'), dict(sync_type='kn')),
    (dict(sync_type='kn', exch_strategy='ar-overlap'), dict(sync_type='kn', overlap=True)),
    (dict(sync_type='cdd', exchange_bn=True), dict(sync_type='cdd', exchange_bn=True)),
    (dict(exch_strategy='ar', wire_dtype='float16'), dict(wire_dtype='float16')),
])
def test_trainer_and_contract_agree_on_the_same_tuple(stop_after_assembly, trainer_kw,
                                                      contract_kw):
    from theanompi_ext.step.assemble import Agreed
    comm_t, comm_c = Recording(), Recording()
    t = trainer_parts(stop_after_assembly, comm_t, **trainer_kw)
    c = contract_parts(stop_after_assembly, comm_c, **contract_kw)
    cfg = TrainConfig(**trainer_kw).validate()
    assert t.agreed == c.agreed == Agreed(cfg.sync_type, cfg.exch_strategy, cfg.exchange_bn,
                                          cfg.wire_dtype)
    # What went to the other ranks: the model's layout, then (plan, agreed tuple, buckets).
    for comm, parts in ((comm_t, t), (comm_c, c)):
        assert len(comm.gathered) == 2
        assert comm.gathered[0] == parts.layout.signature()
        assert comm.gathered[1][1] == tuple(parts.agreed)


def test_assembly_parts_and_exchanged_entries(stop_after_assembly):
    comm = Recording()
    c = contract_parts(stop_after_assembly, comm)
    # flat order: exchanged reversed (last layer first), then the local BN gamma
    assert c.order == [4, 3, 1, 0, 2]
    assert c.layout.names == ['004_b', '003_W', '001_b', '000_W', '002_gamma']
    # exchanged entries: 4 + 8 + 2 + 6, not gamma's 2 (counted by hand)
    assert c.n_exch_params == 4 and c.n_exch == 20 and c.grads.shape == (22,)
    assert c.exchanger.n_exch == 20 and c.rule.sync_type == 'kn'
    assert sum(b.stop - b.start for b in c.buckets) == 20
    t = trainer_parts(stop_after_assembly, Recording())
    assert t.n_exch == 20 and t.order == c.order
    assert t.layout.names == ['layer4.b', 'layer3.W', 'layer1.b', 'layer0.W', 'layer2.gamma']


@pytest.mark.parametrize('field,other', [('wire_dtype', 'bfloat16'), ('exchange_bn', True),
                                         ('exch_strategy', 'ar-overlap')])
def test_a_rank_that_differs_in_the_agreed_tuple_is_refused_on_both_paths(
        stop_after_assembly, field, other):
    from theanompi_ext.step.assemble import Agreed, RankMismatchError
    mine = Agreed('kn', 'ar', False, 'float32')
    theirs = tuple(other if f == field else getattr(mine, f) for f in Agreed._fields)
    with pytest.raises(RankMismatchError, match='bucket plans differ across ranks'):
        trainer_parts(stop_after_assembly, Recording(theirs), exch_strategy='ar')
    # The contract path used to compare only sync_type: now the whole tuple.
    with pytest.raises(RankMismatchError, match='bucket plans differ across ranks'):
        contract_parts(stop_after_assembly, Recording(theirs))
