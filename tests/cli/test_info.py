"""``theanompi-ext info`` says only what it checked (issue 27): the report of a real
run, of a run whose imports are broken on purpose, and how its parts decide."""
import json
import os
import re
import subprocess
import sys
import time

import theanompi_ext
from theanompi_ext.cli.checks import Reporter, reason
from theanompi_ext.cli.info_rows import report_rows
from theanompi_ext.cli.probes import Probe, Stage
from theanompi_ext.collective.world import outside_the_job
from theanompi_ext.launch.same_software import source_digest
from support.paths import ROOT

# Generous: the checks compile into a cache a busy CI machine may not have warmed.
INFO_TIMEOUT = '120'
VERSION_LABELS = ['theanompi_ext', 'python', 'numpy', 'theano', 'mpi4py', 'MPI library',
                  'mpiexec']
PKG_RESOURCES = "ModuleNotFoundError: No module named 'pkg_resources'"
LINE = re.compile(r'^(backend \S+|device \S+|exchange \S+|MPI library|\S+)\s+(.*)$')


def run_info(pythonpath=None):
    """``(rows as a dict, labels in order, output, the modules info itself loaded)``."""
    env = dict(os.environ)
    if pythonpath:
        env['PYTHONPATH'] = os.pathsep.join([pythonpath] + [p for p in [
            env.get('PYTHONPATH')] if p])
    # info's own main, then which heavy modules this (the parent) process holds
    code = ('import sys, json; from theanompi_ext.cli.commands import main; '
            'status = main(["info", "--timeout", sys.argv[1]]); '
            'print(json.dumps([status] + [m in sys.modules for m in '
            '("theano", "mpi4py", "mpi4py.MPI", "pygpu")]))')
    r = subprocess.run([sys.executable, '-c', code, INFO_TIMEOUT], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    *lines, last = r.stdout.strip().splitlines()
    status, *loaded = json.loads(last)
    assert status == 0
    assert 'Traceback' not in r.stdout + r.stderr, r.stdout + r.stderr
    pairs = [LINE.match(l).groups() for l in lines]
    return dict(pairs), [p[0] for p in pairs], '\n'.join(lines), loaded


def test_info_reports_what_it_tried(opencl):
    rows, labels, out, loaded = run_info()
    assert labels[:7] == VERSION_LABELS, out
    assert loaded == [False, False, False, False], 'info itself loaded Theano, MPI or pygpu'
    assert rows['theano'].startswith('1.0.5 (floatX=float32, compiledir='), out
    # what the ranks of a job compare (launch/same_software.py), to compare hosts by hand
    pkg = os.path.join(ROOT, 'theanompi_ext')
    assert rows['theanompi_ext'] == '%s, source %s (%s)' % (
        theanompi_ext.__version__, source_digest(pkg)[:12], pkg), out
    assert rows['backend local'] == 'yes - always'
    assert rows['backend mpi'].startswith('yes - 2 ranks under mpiexec summed a buffer'), out
    devices = rows['devices'].split(', ')
    assert devices[0] == 'cpu' and opencl in devices, out
    assert rows['exchange host'] == 'yes - host buffers over MPI (--device cpu)'
    # the network: which interface and transport, the topology auto picks, and why
    # (launch/network_choice.py; the rule's cases: tests/launch/test_network_default.py)
    assert labels[-3:] == ['interface', 'transport', 'topology'], out
    assert rows['interface'].startswith('none needed: every rank on this host (no hostfile)') \
        or rows['interface'].startswith('%s: set by ' % os.environ.get('THEANOMPI_EXT_IFACE')), out
    assert rows['topology'] == 'auto picks flat: every rank on one host', out
    assert rows['exchange host-staged'].startswith('yes - ') and opencl in \
        rows['exchange host-staged'], out
    if not any(d.startswith('cuda') for d in devices):
        # a machine without a CUDA device (this one): the GPU-only paths say why not
        assert rows['backend pygpu-nccl'] == 'no - no CUDA device opens here', out
        assert rows['exchange nccl'] == ('no - NCCL needs a CUDA device, and none opens '
                                         'here'), out


def test_a_broken_import_is_reported_not_believed(opencl, tmp_path):
    # What `pip install '.[bench]'` once did: a setuptools without pkg_resources,
    # which Theano's GPU backend imports; and, in the same run, mpi4py that cannot load.
    (tmp_path / 'pkg_resources.py').write_text(
        'raise ModuleNotFoundError("No module named \'pkg_resources\'", '
        'name="pkg_resources")\n')
    (tmp_path / 'mpi4py').mkdir()
    (tmp_path / 'mpi4py' / '__init__.py').write_text(
        'raise ImportError("mpi4py broken on purpose")\n')
    rows, labels, out, _ = run_info(str(tmp_path))
    assert labels[:6] == VERSION_LABELS[:5] + ['mpiexec'], out   # no MPI library line
    assert rows['devices'] == 'cpu', out
    assert rows['device %s' % opencl] == 'no - ' + PKG_RESOURCES, out
    assert rows['exchange host-staged'] == 'no - %s: %s' % (opencl, PKG_RESOURCES), out
    assert rows['mpi4py'] == 'UNUSABLE: ImportError: mpi4py broken on purpose', out
    assert rows['backend mpi'] == 'no - ImportError: mpi4py broken on purpose', out
    assert rows['exchange host'] == ('no - backend mpi: ImportError: mpi4py broken on '
                                     'purpose'), out
    assert rows['theano'].startswith('1.0.5 '), out   # the host engine needs neither


# -- the parts, without running the checks ----------------------------------------------

def test_a_check_that_hangs_is_killed_with_what_it_started(tmp_path):
    pids = tmp_path / 'pids'
    hang = ('import os, subprocess, sys, time; '
            'c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]); '
            'open(sys.argv[1], "w").write("%d %d" % (os.getpid(), c.pid)); time.sleep(60)')
    t0 = time.monotonic()
    probe = Probe('nccl', timeout=3, hint='wait longer',
                  launcher=lambda cmd: [sys.executable, '-c', hang, str(pids)])
    stage = probe.stage('probe')
    assert time.monotonic() - t0 < 20
    assert stage == Stage(False, 'timed out after 3 s (wait longer)', {})
    time.sleep(0.5)
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid), 'process %d survived the timeout' % pid
    assert not os.path.exists(probe.report)


def alive(pid):
    """True while ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(') ', 1)[1][:1] != 'Z'
    except FileNotFoundError:
        return False


def test_a_check_that_dies_gives_its_last_words():
    die = 'import sys; sys.stderr.write("lots of noise\\nlibfoo.so: cannot open\\n"); sys.exit(3)'
    probe = Probe('nccl', timeout=60, launcher=lambda cmd: [sys.executable, '-c', die])
    assert probe.stage('probe') == Stage(False, 'libfoo.so: cannot open (exit status 3)', {})
    probe = Probe('nccl', launcher=lambda cmd: ['/nonexistent/mpiexec'] + cmd)
    why = probe.stage('probe').why
    assert why.startswith('could not start the check: FileNotFoundError') and \
        '/nonexistent/mpiexec' in why, why


def test_a_stage_after_a_failure_carries_its_reason(tmp_path):
    path = str(tmp_path / 'report')
    rep = Reporter(path, rank=1)

    def boom():
        raise ModuleNotFoundError("No module named 'pkg_resources'\nmore lines")
    rep.chain([('import', lambda: {'v': 1}), ('compute', boom), ('staged', lambda: {})])
    lines = [json.loads(l) for l in open(path)]
    assert [(l['stage'], l['ok'], l['why']) for l in lines] == [
        ('import', True, None), ('compute', False, PKG_RESOURCES),
        ('staged', False, PKG_RESOURCES)]
    assert lines[0]['info'] == {'v': 1} and {l['rank'] for l in lines} == {1}
    assert reason(RuntimeError('x' * 400)).endswith('...') and len(reason(
        RuntimeError('x' * 400))) == 300


def test_a_check_is_not_a_rank_of_the_job_info_runs_in():
    # under `mpiexec -n 1 theanompi-ext info` the children inherited hydra's PMI_FD and
    # died in PMI_Init (exit status 15) before this
    env = {'PMI_FD': '9', 'PMI_RANK': '0', 'PMI_SIZE': '1', 'HYDI_CONTROL_FD': '7',
           'MPI_LOCALRANKID': '0', 'MPI_LOCALNRANKS': '1', 'OMPI_COMM_WORLD_SIZE': '2',
           'PMIX_RANK': '0', 'OMPI_MCA_btl': 'tcp,self', 'PATH': '/bin'}
    assert outside_the_job(env) == {'OMPI_MCA_btl': 'tcp,self', 'PATH': '/bin'}


class Reported(object):
    """A finished probe: ``stage(name)`` from a dict, a missing stage failed."""

    def __init__(self, **stages):
        self.stages = stages

    def stage(self, name):
        return self.stages.get(name, Stage(False, 'not run', {}))


def ok(**info):
    return Stage(True, None, info)


def fail(why):
    return Stage(False, why, {})


def probed(mpi_sum=ok(ranks=2), cuda_collectives=ok(), nccl=Stage(True, 'NCCL 2.x', {}),
           cuda_staged=ok()):
    return {
        'cpu': Reported(**{'import': ok(theano='1.0.5', floatX='float32', compiledir='/c'),
                           'compute': ok()}),
        'devices': Reported(**{'import': ok(pygpu='0.7.6'),
                               'list': ok(devices=['cuda0', 'opencl0:0'], failed=[])}),
        'nccl': Reported(probe=nccl),
        'mpi': Reported(**{'import': ok(mpi4py='4.1.2'),
                           'init': ok(library='MPICH  5', thread_level='MULTIPLE'),
                           'allreduce': mpi_sum}),
        'each': [('cuda0', Reported(**{'import': ok(), 'compute': ok(), 'staged': cuda_staged,
                                       'collectives': cuda_collectives})),
                 ('opencl0:0', Reported(**{'import': fail('DeviceError: cannot open')}))]}


def test_each_path_is_yes_only_where_what_it_rests_on_passed():
    rows = dict(report_rows(probed(), '/bin/mpiexec'))
    assert rows['devices'] == 'cpu, cuda0'
    assert rows['device opencl0:0'] == 'no - DeviceError: cannot open'
    assert rows['backend mpi'] == 'yes - 2 ranks under mpiexec summed a buffer (MPICH 5)'
    assert rows['backend pygpu-nccl'] == 'yes - pygpu.collectives summed on cuda0 (one rank)'
    assert rows['exchange nccl'] == 'yes - on cuda0'
    assert rows['exchange host-staged'].startswith('yes - ') and \
        rows['exchange host-staged'].endswith('(cuda0)')

    rows = dict(report_rows(probed(mpi_sum=fail('timed out after 30 s'),
                                   cuda_collectives=fail('GpuArrayException: no NCCL'),
                                   nccl=Stage(False, 'libnccl not installed', {})),
                            '/bin/mpiexec'))
    assert rows['backend mpi'] == 'no - timed out after 30 s'
    assert rows['exchange host'] == 'no - backend mpi: timed out after 30 s'
    assert rows['exchange host-staged'] == 'no - backend mpi: timed out after 30 s'
    assert rows['backend pygpu-nccl'] == 'no - cuda0: GpuArrayException: no NCCL'
    assert rows['exchange nccl'] == 'no - libnccl not installed'

    rows = dict(report_rows(probed(cuda_staged=fail('RuntimeError: bad sum')), None,
                            'no mpiexec found'))
    assert rows['mpiexec'] == 'no mpiexec found'
    assert rows['backend mpi'] == 'no - no mpiexec found'
    assert rows['exchange nccl'] == 'no - backend mpi: no mpiexec found'
    assert rows['exchange host-staged'] == ('no - cuda0: RuntimeError: bad sum; '
                                            'opencl0:0: DeviceError: cannot open')
