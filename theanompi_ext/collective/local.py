"""Single-process backend: world size 1, every collective is the identity.

Used by one-process runs and reference computations, so the same training
code runs with and without MPI.
"""
from .base import (Communicator, CompletedHandle, check_bound, check_buffer, check_op,
                   check_timeout, check_wire)
from .wire import WIRE_DTYPES


class LocalCommunicator(Communicator):
    """A world of one rank."""
    name = 'local'
    wire_dtypes = WIRE_DTYPES      # nothing travels: every wire is the identity

    def allreduce(self, buf, op='sum', label=None):
        check_buffer(buf)
        check_op(op)
        return buf

    def start_allreduce(self, buf, name=None, wire='float32'):
        check_buffer(buf)
        check_wire(self, wire)
        return CompletedHandle(buf, name)

    def allgather(self, obj, label=None):
        return [obj]

    def allgather_bounded(self, obj, timeout_s, label=None):
        import json
        check_bound(timeout_s)
        return [json.loads(json.dumps(obj))]       # as it would travel

    def bcast(self, obj, root=0, label=None):
        return obj

    def barrier(self, timeout_s=None, label=None):
        check_timeout(timeout_s)

    def abort(self, code=1):
        import os
        os._exit(code)
