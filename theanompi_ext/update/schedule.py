"""Learning-rate schedule of Goyal et al. 2017 (Sec. 2.1-2.2, Table 1).

* Linear scaling rule: the target rate is ``base_lr * kn / ref_batch``.
* Warm-up over the first ``warmup_epochs`` epochs:
  ``'gradual'``  starts at ``base_lr`` and adds a constant amount *every
                 iteration*, reaching the target after the warm-up;
  ``'constant'`` holds ``base_lr`` for the warm-up, then jumps;
  ``'none'``     starts at the target;
  ``'theanompi'`` Theano-MPI's old rule: multiply by ``k**(1/5)`` once
                 per epoch for five epochs (geometric, per epoch).
* Step decay: divide by ``1/decay_factor`` at each epoch in ``decay_epochs``.
"""

WARMUPS = ('gradual', 'constant', 'none', 'theanompi')


class Schedule(object):
    """lr as a function of the iteration number (0-based).

    Parameters
    ----------
    base_lr : float
        Learning rate of the reference minibatch ``ref_batch`` (0.1 for 256).
    total_batch : int
        kn, the minibatch summed over all workers.
    iters_per_epoch : int
        Iterations in one epoch (every rank runs the same number).
    epochs : int
        Length of training; warm-up must end before it does.
    workers : int
        k, used only by the ``'theanompi'`` warm-up.
    """

    def __init__(self, base_lr, total_batch, iters_per_epoch, epochs,
                 ref_batch=256, warmup='gradual', warmup_epochs=5.0,
                 decay_epochs=(30, 60, 80), decay_factor=0.1, workers=1):
        if not base_lr > 0:
            raise ValueError('base_lr must be > 0, got %r' % (base_lr,))
        for name, val in (('total_batch', total_batch), ('ref_batch', ref_batch),
                          ('iters_per_epoch', iters_per_epoch), ('epochs', epochs),
                          ('workers', workers)):
            if int(val) != val or val < 1:
                raise ValueError('%s must be a positive integer, got %r' % (name, val))
        if warmup not in WARMUPS:
            raise ValueError('unknown warmup %r; choose from %s' % (warmup, WARMUPS))
        if warmup_epochs < 0:
            raise ValueError('warmup_epochs must be >= 0, got %r' % (warmup_epochs,))
        if warmup != 'none' and warmup_epochs >= epochs:
            raise ValueError('warm-up (%g epochs) must be shorter than training '
                             '(%d epochs)' % (warmup_epochs, epochs))
        if not 0 < decay_factor <= 1:
            raise ValueError('decay_factor must be in (0, 1], got %r' % (decay_factor,))
        decay_epochs = tuple(decay_epochs)
        if list(decay_epochs) != sorted(decay_epochs) or any(e <= 0 for e in decay_epochs):
            raise ValueError('decay_epochs must be increasing positive epochs, got %r'
                             % (decay_epochs,))
        self.base_lr = float(base_lr)
        self.total_batch = int(total_batch)
        self.ref_batch = int(ref_batch)
        self.iters_per_epoch = int(iters_per_epoch)
        self.epochs = int(epochs)
        self.warmup = warmup
        self.warmup_epochs = float(warmup_epochs)
        self.decay_epochs = decay_epochs
        self.decay_factor = float(decay_factor)
        self.workers = int(workers)

    @property
    def target_lr(self):
        """The linearly scaled rate ``base_lr * kn / ref_batch``."""
        return self.base_lr * self.total_batch / self.ref_batch

    @property
    def warmup_iters(self):
        """Iterations of warm-up (0 without warm-up)."""
        if self.warmup == 'none':
            return 0
        return int(round(self.warmup_epochs * self.iters_per_epoch))

    def decay(self, iteration):
        """The step-decay multiplier in force at ``iteration``."""
        epoch = iteration // self.iters_per_epoch
        passed = sum(1 for e in self.decay_epochs if epoch >= e)
        return self.decay_factor ** passed

    def lr(self, iteration):
        """Learning rate for iteration ``iteration`` (0-based)."""
        if iteration < 0:
            raise ValueError('iteration must be >= 0, got %r' % (iteration,))
        w = self.warmup_iters
        if self.warmup == 'theanompi':
            # geometric per epoch: base * k**(min(epoch, 5)/5), no kn/ref scaling
            epoch = min(iteration // self.iters_per_epoch, 5)
            return self.base_lr * self.workers ** (epoch / 5.0) * self.decay(iteration)
        if iteration < w:
            if self.warmup == 'constant':
                return self.base_lr
            return self.base_lr + (self.target_lr - self.base_lr) * iteration / float(w)
        return self.target_lr * self.decay(iteration)
