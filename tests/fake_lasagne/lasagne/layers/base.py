"""The layer base classes: one input (:class:`Layer`) or several (:class:`MergeLayer`).

Parameters live in ``layer.params``, an OrderedDict {shared variable: set of
tags}; :meth:`Layer.add_param` tags them ``trainable`` and ``regularizable``
unless told otherwise and names them ``'<layer name>.<param>'`` when the
layer has a name (else just ``'<param>'``).
"""
from collections import OrderedDict

from ..utils import create_param


class Layer(object):
    """A layer with one input: another layer, or a shape tuple."""

    def __init__(self, incoming, name=None):
        if isinstance(incoming, tuple):
            self.input_shape, self.input_layer = incoming, None
        else:
            self.input_shape, self.input_layer = incoming.output_shape, incoming
        self.name = name
        self.params = OrderedDict()

    @property
    def output_shape(self):
        return self.get_output_shape_for(self.input_shape)

    def get_output_shape_for(self, input_shape):
        return input_shape

    def get_output_for(self, input, **kwargs):
        raise NotImplementedError

    def add_param(self, spec, shape, name=None, **tags):
        """Create (or adopt) a parameter, tag it and register it; returns the shared variable."""
        if name is not None and self.name is not None:
            name = '%s.%s' % (self.name, name)
        param = create_param(spec, shape, name)
        flags = {'trainable': True, 'regularizable': True}
        flags.update(tags)
        self.params[param] = set(t for t, on in flags.items() if on)
        return param

    def get_params(self, unwrap_shared=True, **tags):
        """Parameters having every tag given True and none given False."""
        wanted = set(t for t, on in tags.items() if on)
        unwanted = set(t for t, on in tags.items() if not on)
        return [p for p, have in self.params.items()
                if wanted <= have and not (unwanted & have)]


class MergeLayer(Layer):
    """A layer with several inputs (``input_layers``, ``input_shapes``)."""

    def __init__(self, incomings, name=None):
        self.input_shapes = [i if isinstance(i, tuple) else i.output_shape for i in incomings]
        self.input_layers = [None if isinstance(i, tuple) else i for i in incomings]
        self.name = name
        self.params = OrderedDict()

    @property
    def output_shape(self):
        return self.get_output_shape_for(self.input_shapes)

    def get_output_for(self, inputs, **kwargs):
        raise NotImplementedError
