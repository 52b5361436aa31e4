"""The synchronous step, written once for every face (the trainer, Theano-MPI's).

``assemble``  the parts, built once on every rank: flat parameters, the plan
              checked across ranks, the exchanger and the rule, host or
              device chosen here (:mod:`.device` for the device parts).
``run``       :class:`~.run.Step`: one iteration's backward, loss statistics,
              finiteness check, exchange, update, timeline and watchdog.
"""
