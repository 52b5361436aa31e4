"""Buckets: contiguous slices of the flat gradient, reduced in a fixed order.

The flat layout puts exchanged parameters first, in *reverse* model order
(the order backprop produces them), then the parameters updated locally
(BN gamma/beta under the default policy). A bucket is a run of whole
parameters from the exchanged prefix, so it is a contiguous view of the
gradient vector: packing costs no copy and no extra memory.
"""
from .plan import Bucket, plan_buckets, check_plan_across_ranks, flat_order  # noqa: F401
