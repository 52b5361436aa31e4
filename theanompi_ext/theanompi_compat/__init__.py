"""Theano-MPI's face: everything a Theano-MPI user touches, in one package.

Data path of a Theano-MPI run through this project::

    rule.BSP.init / session (tmlauncher)  ->  mpiexec  ->  worker
        worker: options -> feed (the model's own inputs) -> graph / tags
                -> stepper (our exchange, rule and schedule) -> outputs
    exchanger: the same stepper inside Theano-MPI's own worker (way #3)
    strategy: Theano-MPI's exch_strategy names -> our communicators

Modules import Theano only when a model is built, so the launcher side
stays cheap. ``theanompi_ext.tmlauncher``, ``theanompi_ext.rules`` and
``theanompi_ext.exchange.theanompi_exchanger`` are kept as thin aliases.
"""


def __getattr__(name):
    # Lazy: importing the package must not import the rule's or the
    # exchanger's dependencies (the exchanger imports Theano-MPI).
    if name == 'BSP':
        from .rule import BSP
        return BSP
    if name == 'install_into_theanompi':
        from .exchanger import install_into_theanompi
        return install_into_theanompi
    raise AttributeError(name)
