"""The lines of ``theanompi-ext info`` after numpy's, read from the finished checks.

A backend, device or exchange path is ``yes`` only when every check it
rests on passed; else ``no - <the reason the first failed check met>``:

* a device: its engine check loaded Theano on it and computed
  (``import``, ``compute``);
* ``backend mpi``: two ranks under ``mpiexec`` summed a buffer;
* ``exchange host``: the cpu device and ``backend mpi``;
* ``exchange host-staged``: a device whose ``staged`` stage passed, and
  ``backend mpi``;
* ``backend pygpu-nccl``: a CUDA device whose ``collectives`` stage passed;
* ``backend nccl``: the NCCL probe; ``exchange nccl``: a CUDA device,
  the NCCL probe (:func:`~theanompi_ext.step.device.nccl_unavailable`, as
  the step decides) and ``backend mpi``.
"""
ENGINE = ('import', 'compute')


def first_failure(probe, stages):
    """The reason of the first of ``stages`` that failed in ``probe``, or None."""
    for name in stages:
        stage = probe.stage(name)
        if not stage.ok:
            return stage.why
    return None


class Verdicts(object):
    """What the probes say, derived once. ``probed`` maps ``cpu``, ``devices``,
    ``nccl``, ``mpi`` to probes (objects whose ``stage(name)`` gives a
    :class:`~.probes.Stage`) and ``each`` to ``[(device, its engine probe)]``;
    ``mpiexec``: its path, or None and ``mpiexec_error`` saying why."""

    def __init__(self, probed, mpiexec, mpiexec_error=None):
        self.probed, self.mpiexec, self.mpiexec_error = probed, mpiexec, mpiexec_error
        self.cpu_why = first_failure(probed['cpu'], ENGINE)
        self.device_why = {d: first_failure(p, ENGINE) for d, p in probed['each']}
        self.ok = [d for d, _ in probed['each'] if self.device_why[d] is None]
        self.cuda = [d for d in self.ok if d.startswith('cuda')]
        self.nccl = probed['nccl'].stage('probe')
        self.mpi_why = self._mpi_why()

    def _mpi_why(self):
        summed = self.probed['mpi'].stage('allreduce')
        if self.mpiexec is None:
            return self.mpiexec_error
        if not summed.ok:
            return summed.why
        if summed.info.get('ranks') != 2:
            return 'mpiexec -n 2 started ranks of a world of %s' % summed.info.get('ranks')
        return None


def report_rows(probed, mpiexec, mpiexec_error=None):
    """``[(label, value)]``: theano, MPI, the backends, pygpu and the devices, the
    exchange paths (arguments: :class:`Verdicts`)."""
    v = Verdicts(probed, mpiexec, mpiexec_error)
    return version_rows(v) + backend_rows(v) + device_rows(v) + exchange_rows(v)


def version_rows(v):
    """theano (from the cpu check), mpi4py and the MPI library (from the mpi check), mpiexec."""
    theano = v.probed['cpu'].stage('import')
    rows = [('theano', '%s (floatX=%s, compiledir=%s)' % (
        theano.info['theano'], theano.info['floatX'], theano.info['compiledir'])
        if theano.ok else 'UNUSABLE: %s' % theano.why)]
    imported, init = v.probed['mpi'].stage('import'), v.probed['mpi'].stage('init')
    rows.append(('mpi4py', imported.info['mpi4py'] if imported.ok
                 else 'UNUSABLE: %s' % imported.why))
    if imported.ok:
        rows.append(('MPI library', '%s (thread level %s)' % (
            init.info['library'], init.info['thread_level']) if init.ok
            else 'UNUSABLE: %s' % init.why))
    rows.append(('mpiexec', v.mpiexec or v.mpiexec_error))
    return rows


def backend_rows(v):
    """The collective backends."""
    library = v.probed['mpi'].stage('init').info.get('library', '')
    collectives = [d for d, p in v.probed['each'] if d in v.cuda and p.stage('collectives').ok]
    if collectives:
        pygpu_nccl = 'yes - pygpu.collectives summed on %s (one rank)' % ', '.join(collectives)
    elif v.cuda:
        pygpu_nccl = 'no - %s' % '; '.join('%s: %s' % (d, p.stage('collectives').why)
                                          for d, p in v.probed['each'] if d in v.cuda)
    else:
        pygpu_nccl = 'no - no CUDA device opens here'
    return [('backend local', 'yes - always'),
            ('backend mpi', 'no - %s' % v.mpi_why if v.mpi_why else
             'yes - 2 ranks under mpiexec summed a buffer (%s)' % ' '.join(library.split())),
            ('backend nccl', '%s - %s' % ('yes' if v.nccl.ok else 'no', v.nccl.why)),
            ('backend pygpu-nccl', pygpu_nccl)]


def device_rows(v):
    """pygpu, the devices that work, and why each other does not."""
    pygpu, listed = v.probed['devices'].stage('import'), v.probed['devices'].stage('list')
    rows = [('pygpu', pygpu.info['pygpu'] if pygpu.ok else 'no'),
            ('devices', ', '.join((['cpu'] if v.cpu_why is None else []) + v.ok) or 'none')]
    if v.cpu_why:
        rows.append(('device cpu', 'no - %s' % v.cpu_why))
    if not pygpu.ok:
        rows.append(('device pygpu', 'no - %s; `make gpu-deps` as root installs it'
                     % pygpu.why))
    elif not listed.ok:
        rows.append(('device pygpu', 'no - cannot list devices: %s' % listed.why))
    else:   # a kind of device pygpu could not even count (no CUDA driver...)
        rows.extend(('device %s' % kind, 'no - %s' % why) for kind, why in listed.info['failed'])
    rows.extend(('device %s' % d, 'no - %s' % why) for d, why in v.device_why.items() if why)
    return rows


def exchange_rows(v):
    """The exchange paths: each works where its device and MPI work."""
    from ..step.device import nccl_unavailable
    if v.cpu_why or v.mpi_why:
        host = 'no - %s' % ('device cpu: %s' % v.cpu_why if v.cpu_why
                            else 'backend mpi: %s' % v.mpi_why)
    else:
        host = 'yes - host buffers over MPI (--device cpu)'
    staged = {d: first_failure(p, ENGINE + ('staged',)) for d, p in v.probed['each']}
    good = [d for d in v.ok if staged[d] is None]
    if good and not v.mpi_why:
        host_staged = ('yes - device buckets copied to host, MPI, copied back (%s)'
                       % ', '.join(good))
    elif good:
        host_staged = 'no - backend mpi: %s' % v.mpi_why
    elif staged:
        host_staged = 'no - %s' % '; '.join('%s: %s' % item for item in staged.items())
    else:
        host_staged = 'no - no device opens here'
    if not v.cuda:
        why = 'NCCL needs a CUDA device, and none opens here'
    else:
        why = nccl_unavailable(v.cuda[0], probe=lambda: (v.nccl.ok, v.nccl.why))
        if why is None and v.mpi_why:
            why = 'backend mpi: %s' % v.mpi_why
    nccl = 'no - %s' % why if why else 'yes - on %s' % ', '.join(v.cuda)
    return [('exchange host', host), ('exchange host-staged', host_staged),
            ('exchange nccl', nccl)]
