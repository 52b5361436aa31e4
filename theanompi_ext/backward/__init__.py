"""Backward side of the step: gradients of the kn-normalised loss.

``monolithic``  forward + whole backward in one compiled function (the
                serial exchanger's path, and Theano-MPI's).
``chunked``     the backward pass as separately compiled chunks, so each
                bucket's allreduce can start while the next chunk computes.
"""
