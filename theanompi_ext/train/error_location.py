"""Where an exception came from, for the one-line message of a failing rank."""
import os
import traceback

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def error_location(exc):
    """``'file.py:123 in func'`` of the frame that raised ``exc`` (None without a traceback).

    The deepest frame of the user's own code (not this package, not an
    installed library) is named when there is one, e.g. the model file's
    line in ``train_iter``; otherwise the deepest frame.
    """
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    if not frames:
        return None

    def user(f):
        path = os.path.abspath(f.filename)
        return not path.startswith(_OURS) and 'site-packages' not in path and \
            not f.filename.startswith('<')
    pick = next((f for f in reversed(frames) if user(f)), frames[-1])
    where = '%s:%d in %s' % (pick.filename, pick.lineno, pick.name)
    if pick is not frames[-1]:
        last = frames[-1]
        where += ' (raised at %s:%d in %s)' % (last.filename, last.lineno, last.name)
    return where
