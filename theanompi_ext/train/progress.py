"""Progress inside an epoch, on rank 0.

On a terminal: one line refreshed in place (``\\r``) at most a few times a
second; elsewhere (a log file, a pipe): a plain line every ``every``
iterations; nothing with ``--quiet`` or on other ranks. Each line gives the
iteration, images per second (all ranks), the running mean loss of the
epoch, the time left in the epoch and in the run (steps only: validation
not counted), and the fractions of the epoch's time spent waiting for data
and for the exchange (what a user tunes: prefetching, buckets, overlap).

A rank started by mpiexec writes to mpiexec's pipe; the ``train`` launcher
sets :data:`STDOUT_TTY_VAR` when its own stdout is a terminal, so rank 0
still refreshes its line in place.
"""
import io
import os
import sys
import time

STDOUT_TTY_VAR = 'THEANOMPI_EXT_STDOUT_TTY'
# Plain lines: about this many per epoch, for epochs of at least AUTO_MIN_ITERS.
AUTO_LINES, AUTO_MIN_ITERS = 10, 100
REFRESH_S = 0.25


def auto_every(iters_per_epoch):
    """Iterations between plain lines when ``--progress-every`` is 0 (0: none)."""
    if iters_per_epoch < AUTO_MIN_ITERS:
        return 0      # a short epoch: its own line is progress enough
    return max(1, iters_per_epoch // AUTO_LINES)


def stream_is_terminal(stream, environ=None):
    """Whether ``stream`` ends on a terminal (directly or through mpiexec)."""
    env = os.environ if environ is None else environ
    try:
        stream.fileno()          # an in-memory stream is never mpiexec's pipe
        if stream.isatty():
            return True
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False
    return env.get(STDOUT_TTY_VAR) == '1'


def _clock(seconds):
    seconds = max(int(round(seconds)), 0)
    h, rest = divmod(seconds, 3600)
    return '%d:%02d:%02d' % (h, rest // 60, rest % 60) if h else '%d:%02d' % divmod(rest, 60)


class Progress(object):
    """Progress lines of one run.

    Parameters
    ----------
    iters_per_epoch, epochs : int
    total_iters : int
        Iterations of the whole run (``--max-steps`` included).
    total_batch : int
        kn, images per iteration over all ranks.
    enabled : bool
        False on ranks other than 0 and with ``--quiet``.
    every : int
        Plain-line interval (0: :func:`auto_every`).
    restart : (int, int) or None
        The attempt and the restart budget under the supervisor
        (``train/attempt.py``): after a restart each line says "restart 2 of 3".
    stream, terminal
        Where to write (stdout), and whether it is a terminal (detected).
    """

    def __init__(self, iters_per_epoch, epochs, total_iters, total_batch, enabled=True,
                 every=0, stream=None, terminal=None, clock=time.perf_counter, restart=None):
        self.ipe, self.epochs, self.total_iters = iters_per_epoch, epochs, total_iters
        self.total_batch = total_batch
        self.stream = stream or sys.stdout
        self.terminal = stream_is_terminal(self.stream) if terminal is None else terminal
        self.every = every or auto_every(iters_per_epoch)
        self.enabled = bool(enabled) and (self.terminal or self.every > 0)
        self.clock = clock
        # (attempt, max_restarts) of a restarted job: the line says "restart 2 of 3"
        self.restart = restart if restart and restart[0] else None
        self._epoch = None
        self._shown = 0.0
        self._dirty = False

    @classmethod
    def for_trainer(cls, trainer):
        """The reporter of a :class:`~theanompi_ext.train.trainer.Trainer`."""
        cfg = trainer.cfg
        total = cfg.total_iterations(trainer.iters_per_epoch)
        hooks = getattr(trainer, 'attempt', None)
        return cls(trainer.iters_per_epoch, cfg.epochs, total, trainer.total_batch,
                   enabled=trainer.comm.rank == 0 and not cfg.quiet, every=cfg.progress_every,
                   restart=(hooks.attempt, hooks.max_restarts) if hooks else None)

    def start_epoch(self, epoch, first):
        """An epoch starts at iteration ``first`` of it (not 0 after a resume)."""
        self._epoch, self._first = epoch, first
        self._t0 = self.clock()
        self._loss_sum, self._steps, self._exch_s = 0.0, 0, 0.0

    def step(self, done, iteration, loss, data_wait_s, exchange_s):
        """After a step: ``done`` iterations of the epoch finished, ``iteration``
        of the run; ``data_wait_s`` the epoch's data wait so far,
        ``exchange_s`` this step's wait for the exchange."""
        if not self.enabled:
            return
        self._loss_sum += float(loss)
        self._steps += 1
        self._exch_s += exchange_s
        now = self.clock()
        if self.terminal:
            if now - self._shown < REFRESH_S and done < self.ipe:
                return
            self._shown = now
            self.stream.write('\r' + self.line(done, iteration, data_wait_s, now) + '\033[K')
            self._dirty = True
        elif done % self.every == 0 and done < self.ipe:
            self.stream.write(self.line(done, iteration, data_wait_s, now) + '\n')
        else:
            return
        self.stream.flush()

    def line(self, done, iteration, data_wait_s, now):
        """The text of a progress line."""
        elapsed = max(now - self._t0, 1e-9)
        per_it = elapsed / self._steps
        left_epoch = per_it * (self.ipe - done)
        left_run = per_it * max(self.total_iters - iteration, 0)
        return ('progress: %sepoch %d/%d it %d/%d  %.0f img/s  loss %.4f  left %s epoch, %s run'
                '  data wait %.0f%%  exchange wait %.0f%%' % (
                    'restart %d of %d  ' % self.restart if self.restart else '',
                    self._epoch + 1, self.epochs, done, self.ipe,
                    self.total_batch / per_it, self._loss_sum / self._steps,
                    _clock(left_epoch), _clock(left_run),
                    100.0 * data_wait_s / elapsed, 100.0 * self._exch_s / elapsed))

    def end_epoch(self):
        """Clear the terminal line before the epoch's own line."""
        if self.enabled and self.terminal and self._dirty:
            self.stream.write('\r\033[K')
            self.stream.flush()
            self._dirty = False
