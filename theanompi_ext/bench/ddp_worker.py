"""The PyTorch DDP side of ``theanompi-ext bench compare`` (one process per rank).

``python -m theanompi_ext.bench.ddp_worker SPEC.json``, started by
:mod:`.compare` through ``mpiexec``, which here only starts the processes
and gives each its rank (``PMI_RANK``/``PMI_SIZE``); the processes talk
through ``torch.distributed`` on the ``gloo`` backend (TCP, also between
ranks of one machine: gloo has no shared-memory transport). PyTorch is
imported inside functions only, so the package never needs it; it comes
with the optional ``[bench]`` extra (``torch==2.13.0``).

The model is written here to match the project's CIFAR ResNet
(:func:`theanompi_ext.model.resnet.cifar_resnet`) layer for layer: a 3x3
conv-BN-ReLU stem, three stages of basic blocks with widths ``w, 2w, 4w``
(stages 2 and 3 start with stride 2), option-B shortcuts (1x1 conv with the
block's stride, then BN) where the shape changes, the last BN of every
residual branch starting at gamma 0, no convolution biases, global average
pooling and one fully connected layer. Same parameter count (272,474 for
ResNet-20 with 10 classes, 4,327,754 for the 4x wide one).

Modes timed (see :func:`.timing.time_modes` for the protocol):

``compute``    forward, backward and SGD step inside ``DDP.no_sync()``:
               no communication at all
``serial``     the same, then every gradient summed in one flat
               ``all_reduce`` after the backward pass (the exchange not
               overlapped), then the step
``full``       an ordinary DDP step: bucket allreduces started by autograd
               hooks during the backward pass
``allreduce``  the flat ``all_reduce`` of the gradient bytes alone

With ``spec['ddp_comm_hook'] == 'fp16'`` DDP gets PyTorch's
``fp16_compress_hook`` (``register_comm_hook``): each bucket is cast to
float16 and divided by the world size, summed by gloo (in float16), and
cast back. ``serial`` and ``allreduce`` then do the same with the flat
gradient (a float16 copy, divided, ``all_reduce``, copied back), so the
serial step moves the same bytes the same way. Before the timed steps such
a job checks that the hook really runs (:func:`check_fp16_hook`).
"""
import json
import os
import sys

from ..errors import EXIT_FAILED, EXIT_OK
from ..files.atomic import write_json

MODES = ('compute', 'serial', 'full', 'allreduce')


def torch_problem(python=None):
    """Why PyTorch cannot be used here, or by the interpreter ``python`` (a path;
    None: this one), or None."""
    if python is None or python == sys.executable:
        import importlib.util
        if importlib.util.find_spec('torch') is None:
            return ("PyTorch is not installed (pip install 'theanompi_ext[bench]', "
                    'which pins torch==2.13.0)')
        return None
    import subprocess
    try:
        r = subprocess.run([python, '-c', 'import torch.distributed'], capture_output=True,
                           text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return '--ddp-python %s cannot run (%s)' % (python, exc)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ['exit status %d' % r.returncode])[-1]
        return '--ddp-python %s cannot import torch.distributed (%s)' % (python, last)
    return None


def package_path():
    """The folder that holds the ``theanompi_ext`` package (for another
    interpreter's ``PYTHONPATH``: ``--ddp-python``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_resnet(depth=20, width=16, n_classes=10, in_channels=3, seed=0):
    """A CIFAR ResNet of basic blocks in PyTorch, matching :func:`cifar_resnet`.

    Returns a ``torch.nn.Module``. Initial values follow the project's
    choices where they matter for the architecture (zero gamma on the last
    BN of each branch); the weights themselves only need the right shapes.
    """
    import torch
    from torch import nn
    if depth < 8 or (depth - 2) % 6:
        raise ValueError('depth must be 6n + 2 with n >= 1, not %r' % (depth,))
    torch.manual_seed(seed)

    def bn(c, gamma=1.0):
        # momentum 0.1 in PyTorch's convention is the project's 0.9.
        layer = nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)
        nn.init.constant_(layer.weight, gamma)
        return layer

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv_a = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn_a = bn(cout)
            self.conv_b = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn_b = bn(cout, gamma=0.0)     # the block starts as the identity
            self.proj = None
            if stride != 1 or cin != cout:
                self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                          bn(cout))

        def forward(self, x):
            h = torch.relu(self.bn_a(self.conv_a(x)))
            h = self.bn_b(self.conv_b(h))
            return torch.relu(h + (x if self.proj is None else self.proj(x)))

    n = (depth - 2) // 6
    layers = [nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), bn(width), nn.ReLU()]
    cin = width
    for stage in range(3):
        cout = width * 2 ** stage
        for j in range(n):
            layers.append(Block(cin, cout, 2 if (stage > 0 and j == 0) else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, n_classes)]
    return nn.Sequential(*layers)


def build_digits_cnn(width=16, n_classes=10, in_channels=1, seed=0):
    """PyTorch twin of the zoo's ``digits_cnn`` (the ``--quick`` model).

    Three 3x3 conv-BN-ReLU layers (``w``, ``2w`` at stride 2, ``2w``), no
    convolution biases, global average pooling, one fully connected layer.
    """
    import torch
    from torch import nn
    torch.manual_seed(seed)
    layers, cin = [], in_channels
    for cout, stride in ((width, 1), (2 * width, 2), (2 * width, 1)):
        layers += [nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                   nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1), nn.ReLU()]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, n_classes)]
    return nn.Sequential(*layers)


def build_model(model_spec, n_classes=10, seed=0):
    """The PyTorch twin of a :data:`.compare_systems.MODEL_SPECS` entry."""
    shape = model_spec['input_shape']
    if model_spec['kind'] == 'cifar_resnet':
        return build_resnet(model_spec['depth'], model_spec['width'], n_classes, shape[0], seed)
    if model_spec['kind'] == 'digits_cnn':
        return build_digits_cnn(model_spec['width'], n_classes, shape[0], seed)
    raise ValueError('no PyTorch twin for model kind %r' % (model_spec['kind'],))


def count_params(model):
    """Trainable scalars of a ``torch.nn.Module``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _rank_and_size():
    """This process's rank and the world size, from the launcher's variables."""
    for r, s in (('PMI_RANK', 'PMI_SIZE'), ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
                 ('RANK', 'WORLD_SIZE')):
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    raise RuntimeError('no rank in the environment: start this with mpiexec '
                       '(theanompi-ext bench compare does)')


def measure(spec):
    """Time the DDP modes on this rank (collective over the gloo group).

    Returns, on every rank, ``{mode: [[per-step seconds] of each rank]}``
    plus ``grad_bytes`` and ``params``.
    """
    import torch
    import torch.distributed as dist
    from .compare_rank import cpu_per_wall
    from .timing import time_modes

    rank, size = _rank_and_size()
    _start_gloo(spec, rank, size)
    try:
        run, net, n_grads, hook_check = _ddp_modes(spec, rank, size)
        cpu = {}
        local = time_modes(run, MODES, spec['steps'], spec['reps'], dist.barrier,
                           warmup=spec['warmup'], cpu=cpu)
        out = {}
        for mode in MODES:
            mine = torch.tensor(local[mode], dtype=torch.float64)
            every = [torch.zeros_like(mine) for _ in range(size)]
            dist.all_gather(every, mine)
            out[mode] = [[float(v) for v in t] for t in every]
        every_cpu = [None] * size
        dist.all_gather_object(every_cpu, cpu)
        out['cpu_per_wall'] = cpu_per_wall(every_cpu)
        out['grad_bytes'] = 4 * n_grads
        out['params'] = count_params(net)
        out['torch'] = torch.__version__
        out['hook_check'] = hook_check
        return out
    finally:
        dist.destroy_process_group()


def _start_gloo(spec, rank, size):
    """Torch's threads as ``spec`` says, and the gloo group over the loopback."""
    import torch
    import torch.distributed as dist
    threads = int(spec['threads'])
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass   # only allowed before any parallel work; harmless if refused
    os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
    os.environ['MASTER_PORT'] = str(spec['port'])
    # Stay on the loopback: in the rate-limited namespace it is the
    # emulated network; outside it gloo would otherwise pick eth0.
    os.environ.setdefault('GLOO_SOCKET_IFNAME', 'lo')
    dist.init_process_group('gloo', rank=rank, world_size=size)


def _ddp(net, spec):
    """``net`` wrapped in DistributedDataParallel, buffers kept per rank."""
    import inspect
    from torch.nn.parallel import DistributedDataParallel
    # Buffers (BN running statistics) stay per rank, as in the project;
    # broadcasting them every forward would add communication it lacks.
    # (torch 2.13 renamed the option; older releases know only the old name.)
    no_buffer_sync = ({'forward_sync_buffers': False} if 'forward_sync_buffers' in
                      inspect.signature(DistributedDataParallel.__init__).parameters
                      else {'broadcast_buffers': False})
    ddp = DistributedDataParallel(net, bucket_cap_mb=spec['ddp_bucket_cap_mb'],
                                  **no_buffer_sync)
    hook = spec.get('ddp_comm_hook', 'none')
    if hook == 'fp16':
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import \
            fp16_compress_hook
        ddp.register_comm_hook(state=None, hook=fp16_compress_hook)
    elif hook != 'none':
        raise ValueError("unknown DDP comm hook %r; choose 'none' or 'fp16'" % (hook,))
    return ddp


def _ddp_modes(spec, rank, size):
    """``({mode: one step of it}, the model, number of gradient entries, the
    hook check's figures or None)``."""
    import torch
    import torch.distributed as dist
    shape = tuple(spec['model_spec']['input_shape'])
    net = build_model(spec['model_spec'], spec['n_classes'], seed=0)
    ddp = _ddp(net, spec)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.001, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn((spec['batch'],) + shape, generator=g)
    y = torch.randint(0, spec['n_classes'], (spec['batch'],), generator=g)
    params = [p for p in ddp.parameters() if p.requires_grad]
    flat = torch.zeros(sum(p.numel() for p in params))
    fp16 = spec.get('ddp_comm_hook', 'none') == 'fp16'
    # What the flat all_reduce sends: DDP's bucket dtype, float16 with the hook.
    zeros = torch.zeros(flat.numel(), dtype=torch.float16 if fp16 else torch.float32)

    def fwd_bwd():
        opt.zero_grad(set_to_none=False)
        loss_fn(ddp(x), y).backward()

    def compute():
        with ddp.no_sync():
            fwd_bwd()
        opt.step()

    def serial():
        with ddp.no_sync():
            fwd_bwd()
        # The same bytes as DDP's buckets, summed only after backward.
        torch.cat([p.grad.reshape(-1) for p in params], out=flat)
        flat_average(flat, size, fp16)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        opt.step()

    def full():
        fwd_bwd()
        opt.step()

    check = check_fp16_hook(fwd_bwd, ddp, params, size) if fp16 else None
    run = {'compute': compute, 'serial': serial, 'full': full,
           'allreduce': lambda: dist.all_reduce(zeros)}
    return run, net, int(flat.numel()), check


def flat_average(flat, size, fp16):
    """``flat`` (float32) replaced in place by its mean over the ranks.

    ``fp16``: as ``fp16_compress_hook`` does it, cast to float16, divided by
    the world size, summed by ``all_reduce`` in float16, cast back.
    """
    import torch
    import torch.distributed as dist
    if fp16:
        half = flat.to(torch.float16).div_(size)
        dist.all_reduce(half)
        flat.copy_(half)
    else:
        dist.all_reduce(flat)
        flat.div_(size)


def check_fp16_hook(fwd_bwd, ddp, params, size):
    """Check that DDP's gradients come from the fp16 hook; returns its figures.

    One backward inside ``no_sync()`` gives each rank's own gradient; then an
    ordinary DDP backward on the same weights and batch. Its gradient must
    be exactly float16-representable (the hook casts back from float16) and
    equal the float64 mean of the ranks' gradients within float16 rounding:
    each rank's cast, the division and every partial sum round once, at most
    2**-11 of the magnitudes summed each time, plus float16's subnormal
    step per rounding. RuntimeError when either fails.
    """
    import torch
    import torch.distributed as dist

    def flat_grad():
        return torch.cat([p.grad.reshape(-1) for p in params]).clone()
    with ddp.no_sync():
        fwd_bwd()
    mine = flat_grad().double()
    fwd_bwd()
    got = flat_grad().double()
    every = [torch.zeros_like(mine) for _ in range(size)]
    dist.all_gather(every, mine)
    mean = sum(every) / size
    mag = sum(e.abs() for e in every) / size
    bound = (size + 2) * 2.0 ** -11 * mag + (size + 2) * 2.0 ** -24
    err = (got - mean).abs()
    exact = bool(torch.equal(got.to(torch.float16).double(), got))
    res = dict(max_abs_err=float(err.max()), max_bound=float(bound.max()),
               within_bound=bool((err <= bound).all()), float16_exact=exact,
               changed_by_rounding=int((got != mean).sum()))
    if not (exact and res['within_bound']):
        raise RuntimeError('DDP fp16_compress_hook check failed: %r' % (res,))
    return res


def main(argv=None):
    """Entry point of each rank: ``python -m theanompi_ext.bench.ddp_worker SPEC.json``."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    rank, size = _rank_and_size()
    try:
        res = measure(spec)
    except BaseException as exc:   # noqa: B902 - report the rank, let mpiexec stop the rest
        sys.stderr.write('theanompi-ext bench compare (ddp): rank %d of %d failed: %s: %s\n'
                         % (rank, size, type(exc).__name__, exc))
        sys.stderr.flush()
        return EXIT_FAILED
    if rank == 0:
        write_json(spec['out'], res, 'the rank results')
    return EXIT_OK


def exit_now(status):
    """End the process with ``status`` without running interpreter teardown.

    torch 2.13 sometimes aborts ("terminate called without an active
    exception") while destroying its C++ objects at exit after a gloo job,
    with the fp16 hook more often (its callbacks run on gloo's threads): the
    results are written by then, but mpiexec would report the job failed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == '__main__':
    exit_now(main())
