"""Theano-MPI's rule interface: ``BSP().init(devices, modelfile, modelclass)`` + ``wait()``.

The one-line change for a Theano-MPI user is the import::

    from theanompi_ext import BSP      # was: from theanompi import BSP
    rule = BSP()                       # sync_type 'kn', exch_strategy 'ar' by default
    rule.init(devices=['cuda0', 'cuda1'], modelfile='models.cifar10', modelclass='Cifar10_model')
    rule.wait()

``init`` starts one rank per device with ``mpiexec -n K python -u -m
theanompi_ext.theanompi_compat.worker ...`` (no MPMD: the device list travels in
argv and rank r takes entry r) and returns at once; ``wait`` returns the
job's exit status (0 when every rank succeeded) and on Ctrl-C stops every
rank. This module imports neither Theano nor the model: it is the
launching side.
"""
import ast
import importlib.util
import os
import signal
import subprocess
import sys
import threading

from .. import stop_signals
from ..errors import EXIT_SIGNAL_BASE
from ..exchange.modes import check_mode


def _model_source(modelfile):
    """Path of the model's source file, without importing it (ValueError if missing)."""
    if modelfile.endswith('.py') or os.path.sep in modelfile:
        if not os.path.isfile(modelfile):
            raise ValueError('model file %s not found' % modelfile)
        return modelfile
    # The ranks get the working directory on PYTHONPATH; search it here too.
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    from ..engine.flags import configured_environment
    try:
        # find_spec imports the module's parent packages, which may import
        # Theano: configure it first, as the ranks do.
        with configured_environment():
            spec = importlib.util.find_spec(modelfile)
    except (ImportError, ValueError) as exc:
        parent = modelfile.rpartition('.')[0]
        missing = getattr(exc, 'name', None) or ''
        # A module of the dotted path itself missing is "not found"; anything
        # else is the package's own import failing (a dependency, a bug).
        if isinstance(exc, ImportError) and parent and missing and \
                not (modelfile + '.').startswith(missing + '.'):
            raise ValueError('model module %s: importing its package %s failed: %s: %s'
                             % (modelfile, parent, type(exc).__name__, exc))
        spec, why = None, str(exc)
    else:
        why = 'no such module'
    finally:
        if added:
            sys.path.remove(os.getcwd())
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise ValueError('model file %s not found (%s; searched the working directory '
                         'and PYTHONPATH)' % (modelfile, why))
    return spec.origin


def check_model(modelfile, modelclass):
    """Refuse a missing model module/file or class, naming it (no import, no Theano).

    The class must be defined or imported at the top level of the module.
    """
    path = _model_source(modelfile)
    if not path.endswith('.py'):
        return path                 # compiled module: cannot inspect, the ranks will tell
    with open(path) as f:
        try:
            tree = ast.parse(f.read(), path)
        except SyntaxError as exc:
            raise ValueError('model file %s does not parse: %s' % (path, exc))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split('.')[0] for a in node.names)
    if modelclass not in names:
        raise ValueError('model class %s not found in model file %s' % (modelclass, path))
    return path


def _flag(text):
    text = str(text).strip().lower()
    if text not in ('1', 'true', 'yes', 'on', '0', 'false', 'no', 'off'):
        raise ValueError('expected true or false')
    return text in ('1', 'true', 'yes', 'on')


#: Options of the launching side (the job process, :mod:`.restart_job`):
#: name -> (default, parser); not passed to the ranks. ``resume``: start from
#: ``OUT/checkpoint.h5`` (a run stopped after a ``checkpoint_signal``'s checkpoint).
RESTART_OPTIONS = {'max_restarts': (0, int), 'restart_backoff_s': (1.0, float),
                   'start_timeout_s': (300.0, float), 'resume': (False, _flag)}


def restart_settings(options):
    """Pop the job process's options from ``options``: ``{name: value}``
    (ValueError for a bad value, for ``max_restarts``, ``resume``,
    ``checkpoint_signal`` or ``checkpoint_every_s`` without ``out``, for
    ``resume`` without a good checkpoint there, and for
    ``on_checkpoint_signal='stop'`` without a signal).
    ``checkpoint_signal`` stays in ``options`` (the ranks catch it), canonical."""
    from .options import OPTION_DEFAULTS
    got = {}
    for key, (default, parse) in RESTART_OPTIONS.items():
        raw = options.pop(key, default)
        try:
            got[key] = parse(str(raw).strip() or default)
            if got[key] < 0:
                raise ValueError('must be >= 0')
        except ValueError as exc:
            raise ValueError('option %s=%r: %s' % (key, raw, exc))
    out = str(options.get('out') or '').strip()
    if got['max_restarts'] and not out:
        raise ValueError('option max_restarts: a restart resumes from OUT/checkpoint.h5, which '
                         'rank 0 writes at the end of every epoch: give the option out')

    def parsed(key):       # as the ranks parse it (options.OPTION_DEFAULTS)
        default, parse = OPTION_DEFAULTS[key]
        raw = options.get(key, default)
        try:
            return parse(raw)
        except ValueError as exc:
            raise ValueError('option %s=%r: %s' % (key, raw, exc))
    signal_name = parsed('checkpoint_signal')
    if signal_name:
        options['checkpoint_signal'] = signal_name
    for key, value in (('checkpoint_signal', signal_name),
                       ('checkpoint_every_s', parsed('checkpoint_every_s'))):
        if value and not out:
            raise ValueError('option %s: the checkpoint is written to OUT/checkpoint.h5: '
                             'give the option out' % key)
    if parsed('on_checkpoint_signal') == 'stop' and not signal_name:
        raise ValueError('option on_checkpoint_signal: stop after the checkpoint of which '
                         'signal? Give the option checkpoint_signal, e.g. USR1')
    if got['resume']:
        if not out:
            raise ValueError('option resume: the checkpoint to resume from is '
                             'OUT/checkpoint.h5: give the option out')
        from .resume import read_position
        try:
            read_position(os.path.join(out, 'checkpoint.h5'))
        except ValueError as exc:        # CheckpointError: missing, corrupt, not ours
            raise ValueError('option resume: %s' % exc)
    return got


def _child_env(options):
    from .options import option_env_name, OPTION_DEFAULTS
    from .resume import RESUME_VAR
    from ..launch.mpiexec import child_env
    env = child_env()
    env[RESUME_VAR] = '0'      # the job process says when the ranks resume
    # The model module is named relative to where the user runs, as with Theano-MPI.
    env['PYTHONPATH'] = os.pathsep.join([os.getcwd()] + [p for p in
                                         env.get('PYTHONPATH', '').split(os.pathsep) if p])
    for key, value in options.items():
        if key not in OPTION_DEFAULTS:
            raise ValueError('unknown option %r; known: %s' % (key, ', '.join(sorted(OPTION_DEFAULTS))))
        try:     # a bad value refused here, before any rank starts
            OPTION_DEFAULTS[key][1](str(value))
        except ValueError as exc:
            raise ValueError('option %s=%r: %s' % (key, value, exc))
        env[option_env_name(key)] = str(value)
    return env


def check_exchange_options(sync_type, exch_strategy, wire):
    """Refuse a bad rule, strategy or ``wire_dtype`` before any rank starts
    (the one check of :func:`theanompi_ext.exchange.modes.check_mode`)."""
    from ..collective.wire import check_wire_dtype
    check_wire_dtype(wire)
    check_mode(sync_type, exch_strategy, wire)


def _raise_stopped(signum, frame):
    from ..launch.postmortem import Stopped
    # the stop's own second signal is ignored until wait returns (stop_signals.hold)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is _raise_stopped:
            signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def _catch_default_stops():
    """SIGTERM and SIGHUP raise ``Stopped`` in :meth:`BSP.wait` where they have their
    default action now (main thread); the previous handlers, for ``restore``. A
    handler of the caller's, or an ignored signal, is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return stop_signals.catch({sig: _raise_stopped for sig in (signal.SIGTERM, signal.SIGHUP)
                               if signal.getsignal(sig) == signal.SIG_DFL})


class BSP(object):
    """Bulk-synchronous data parallelism with this project's exchange.

    Class attributes (set them on the class or the instance before init):
    ``sync_type`` ('kn' default; 'avg', 'cdd' as Theano-MPI) and
    ``exch_strategy`` ('ar' default; 'ar-overlap').
    """
    sync_type = 'kn'
    exch_strategy = 'ar'

    def __init__(self):
        self.proc = None
        self.devices = None
        self.command = None
        self._forward = None     # option checkpoint_signal: passed on to the job

    def init(self, devices, modelfile, modelclass, **options):
        """Start one rank per device and return immediately.

        ``devices``: list like ``['cuda0', 'cuda1']``, ``['opencl0:0',
        'opencl0:0']`` or ``['cpu0', 'cpu1']`` (also a comma-separated
        string), or across nodes Theano-MPI's ``['node0:cuda0',
        'node1:cuda0,cuda1']``: rank r computes on the r-th device (``cpu``/
        ``cpuN``: the host backend). An unknown device string is a
        :class:`~theanompi_ext.errors.DeviceError` (a ValueError) here. ``options``: exchange options of
        :data:`theanompi_ext.theanompi_compat.options.OPTION_DEFAULTS` (e.g.
        ``warmup='theanompi'``), passed to the ranks in the environment, and
        those of :data:`RESTART_OPTIONS`: with ``max_restarts=N`` (needs
        ``out``) a process started here runs the job under the restart
        supervisor (:mod:`.restart_job`), from the checkpoint of the last
        finished epoch (:mod:`.resume`); ``wait`` waits for it. With
        ``checkpoint_signal='USR1'`` (needs ``out``; as ``train
        --checkpoint-signal``) this process catches that signal from ``init``
        until ``wait`` returns and passes it on: every rank writes
        ``OUT/checkpoint.h5`` after the same next iteration, then goes on, or,
        with ``on_checkpoint_signal='stop'``, stops with status 75; with
        ``resume=True`` the job starts from that checkpoint. Otherwise
        the job runs as ``theanompi-ext train`` runs it
        (:func:`~theanompi_ext.launch.postmortem.run_explained`, in a process
        of its own): a rank that dies is named in the launcher's last line.
        """
        from ..launch.mpiexec import mpiexec_command, find_mpiexec, is_openmpi, popen_job
        from ..launch.postmortem import explained_command
        from ..engine.devices import parse_devices
        from ..launch.devices import remote_hosts, host_args, split_hosts
        from ..launch.reach import check_hosts
        from ..engine.flags import cache_dir
        restart = restart_settings(options)
        signal_name = options.get('checkpoint_signal', '')
        if signal_name and threading.current_thread() is not threading.main_thread():
            raise ValueError('option checkpoint_signal: call BSP.init in the main thread (it '
                             'catches SIG%s for the job until BSP.wait returns)' % signal_name)
        cache_dir()     # unusable: bad input, here; another host's ranks say theirs
        if not devices:
            raise ValueError('no devices given')
        pairs = parse_devices(devices)  # an unknown device string: DeviceError, before launch
        devices = [d for _, d in pairs]
        hosts = remote_hosts(pairs)
        check_exchange_options(self.sync_type, self.exch_strategy,
                               options.get('wire_dtype', 'float32'))
        check_model(modelfile, modelclass)
        env = _child_env(options)
        argv = [sys.executable, '-u', '-m', 'theanompi_ext.theanompi_compat.worker', modelfile,
                modelclass, self.sync_type, self.exch_strategy, ','.join(devices)]
        self.devices = devices
        mpiexec = find_mpiexec()
        if hosts:
            check_hosts([h for h, _ in hosts])    # Unreachable (status 2) names the host
            split = split_hosts(hosts)
            if split and not is_openmpi(mpiexec):
                sys.stderr.write(
                    'theanompi-ext: warning: DEVICES lists %s again after another host: '
                    'MPICH starts each run of entries as a node of its own (no shared '
                    'memory between them, local ranks counted per run); list each host\'s '
                    'devices together\n' % ', '.join(split))
        self.command = mpiexec_command(len(devices), argv, mpiexec=mpiexec,
                                       extra=host_args(hosts, mpiexec) if hosts else (),
                                       hosts=[h for h, _ in hosts] if hosts else None)
        if restart['max_restarts'] or restart['resume'] or signal_name:
            # The supervisor runs in a process of its own (it reaps and ends whatever
            # an attempt leaves behind: nothing of the caller's); wait() waits for it.
            # So does a job whose checkpoints a signal asks for (it passes it on).
            from .restart_job import supervisor_command
            command = supervisor_command(self.command, len(devices), options['out'], restart,
                                         checkpoint_signal=signal_name, across_hosts=bool(hosts))
            if not signal_name:
                self.proc = popen_job(command, env)
                return self
            from ..launch.forwarded_signal import forward_to_child
            from ..train.checkpoint_request import number
            self.proc, self._forward = forward_to_child(number(signal_name),
                                                        lambda: popen_job(command, env))
            return self
        # The job runs as `theanompi-ext train` runs it (hydra's teardown held back,
        # a rank that died named last), in a process of its own: init returns now.
        # Own process group: wait() can stop it, and it every rank; killed with
        # this process, whatever the signal (popen_job).
        self.proc = popen_job(explained_command(self.command, len(devices)), env)
        return self

    def wait(self, timeout=None):
        """Wait for the ranks; return the exit status (non-zero if any rank failed).

        Ctrl-C (or ``timeout`` seconds passing) stops every rank; the status
        is then 130 (or 124), and the last line on stderr says so (the job's
        own process, stopped by SIGTERM, says 143 just before it). SIGTERM and
        SIGHUP stop it the same way (143, 129: a scheduler's ``kill`` of
        ``tmxlauncher``, a closed terminal), where this process left them to
        their default (its own handler, or an ignored signal, is kept). Ctrl-Z
        (SIGTSTP) pauses every rank where the MPI lets it, then this process;
        SIGCONT (``fg``) resumes them (:mod:`theanompi_ext.launch.job_control`).
        """
        if self.proc is None:
            raise RuntimeError('BSP.wait() before BSP.init()')
        from ..launch.awake import wait_awake
        from ..launch.job_control import PassOn
        from ..launch.postmortem import Stopped
        # Ctrl-Z pauses the job (its own launcher pauses the ranks), fg resumes it
        job_control = PassOn(self.proc).install()
        caught = _catch_default_stops()
        held = {}
        try:
            return wait_awake(self.proc, timeout)   # Ctrl-C taken by any thread of the session
        except KeyboardInterrupt:
            held = self._hold_stops()       # a second Ctrl-C must not cut the stop short
            return self._stopped(130, 'interrupted (Ctrl-C)')
        except subprocess.TimeoutExpired:
            return self._stopped(124, 'still running after timeout=%g s' % timeout)
        except Stopped as exc:
            held = self._hold_stops()
            return self._stopped(EXIT_SIGNAL_BASE + exc.signum, 'stopped by %s' % exc)
        finally:
            # the caller's process goes on: its handlers back, in the order taken
            stop_signals.restore(held)
            stop_signals.restore(caught)
            job_control.restore()
            if self._forward is not None and self.proc.poll() is not None:
                self._forward.detach()      # checkpoint_signal: ours again once the job ended
                self._forward.restore()
                self._forward = None

    #: Set by ``tmxlauncher``, whose process ends when wait returns: a stop's later
    #: copies of the signal stay ignored (``stop_signals.begin_stop``), not put back.
    _ends_process = False

    def _hold_stops(self):
        if self._ends_process:
            return stop_signals.begin_stop()
        return stop_signals.hold()

    def _stopped(self, status, why):
        from ..launch.mpiexec import stop_group
        stop_group(self.proc)
        sys.stderr.write('theanompi-ext: BSP.wait() %s: every rank was stopped (exit status '
                         '%d)\n' % (why, status))
        sys.stderr.flush()
        return status
