"""Losses and accuracies per example (the caller takes the mean)."""
import theano.tensor as T


def categorical_crossentropy(predictions, targets):
    """-log p[target] per example; ``targets`` integer labels or one-hot rows."""
    return T.nnet.categorical_crossentropy(predictions, targets)


def categorical_accuracy(predictions, targets, top_k=1):
    """1 where the target is among the ``top_k`` largest predictions, else 0."""
    if targets.ndim == predictions.ndim:
        targets = T.argmax(targets, axis=-1)
    if top_k == 1:
        return T.eq(T.argmax(predictions, axis=-1), targets)
    best = T.argsort(predictions, axis=-1)[:, -top_k:]
    return T.any(T.eq(best, targets.dimshuffle(0, 'x')), axis=-1)
