"""Layers joining several inputs."""
from .base import MergeLayer


class ElemwiseSumLayer(MergeLayer):
    """``sum(coeff_i * input_i)`` of inputs of one shape (residual connections)."""

    def __init__(self, incomings, coeffs=1, **kwargs):
        super(ElemwiseSumLayer, self).__init__(incomings, **kwargs)
        self.coeffs = list(coeffs) if isinstance(coeffs, (list, tuple)) \
            else [coeffs] * len(incomings)
        if len(self.coeffs) != len(incomings):
            raise ValueError('%d coefficients for %d inputs' % (len(self.coeffs), len(incomings)))

    def get_output_shape_for(self, input_shapes):
        first = input_shapes[0]
        if any(len(s) != len(first) or any(a is not None and b is not None and a != b
                                            for a, b in zip(s, first)) for s in input_shapes):
            raise ValueError('ElemwiseSumLayer: inputs of different shapes %s' % (input_shapes,))
        return tuple(first)

    def get_output_for(self, inputs, **kwargs):
        total = None
        for c, x in zip(self.coeffs, inputs):
            term = x if c == 1 else c * x
            total = term if total is None else total + term
        return total
