"""The model's trainable parameters and their gradients as views of flat device vectors.

On a device (``--device cuda0`` / ``opencl0:0``) the master copy of the
parameters is one flat float32 device vector; every model shared variable
holds a view of it (its own shape, at its layout offset), so the compiled
forward/backward read what the compiled update wrote, with no copy. The
gradients are a second flat device vector in the same layout; the
backward writes each gradient into its view, and a bucket is a slice of
it (a view, no copy). Host copies of the parameters are made only when
asked for (:attr:`DeviceParamSet.values`: checkpoints, replica checks,
the final ``params.npz``).
"""
from ..engine.core import device_value, device_zeros, shared


def view_offset(view, flat):
    """Element offset of device array ``view`` inside ``flat``, or None when it
    is not a view of ``flat``'s memory (pygpu: same allocation, ``offset`` bytes)."""
    if view.base_data != flat.base_data:
        return None
    return (view.offset - flat.offset) // flat.itemsize


class DeviceParamSet(object):
    """Same interface as :class:`~theanompi_ext.params.ParamSet`, device-resident.

    Built from the host ``ParamSet`` (whose values it copies to the device
    once); ``vars``, ``layout`` and ``tags`` are the same objects.
    """

    def __init__(self, host_params):
        self.vars, self.layout, self.tags = host_params.vars, host_params.layout, host_params.tags
        self.indices = host_params.indices
        self._host = host_params.values          # host mirror, valid while _host_fresh
        self.flat_var = shared(self._host.copy(), name='params_flat')
        self._host_fresh = True
        self._bound_to = None
        self.bind()

    @property
    def flat(self):
        """The flat device vector of the parameters."""
        return device_value(self.flat_var)

    def bind(self):
        """Make every shared variable hold its view of :attr:`flat`."""
        flat = self.flat
        for i, var in enumerate(self.vars):
            var.set_value(self.layout.view(flat, i), borrow=True)
        self._bound_to = flat
        bad = [self.layout.names[i] for i, o in enumerate(self.offsets())
               if o != self.layout.offsets[i]]
        if bad:
            raise RuntimeError('parameters %s did not keep their view of the flat device '
                               'vector' % bad)

    def offsets(self):
        """Each shared variable's element offset in :attr:`flat` (None: not a view)."""
        return [view_offset(device_value(v), self.flat) for v in self.vars]

    def after_update(self):
        """The device values changed: rebind if the update did not work in place,
        and mark the host mirror stale."""
        if self.flat is not self._bound_to:
            self.bind()
        self._host_fresh = False

    @property
    def values(self):
        """Host copy of the flat parameters (copied from the device when stale).

        Changes made to it reach the device at the next :meth:`push`.
        """
        if not self._host_fresh:
            self.flat.read(self._host)
            self._host_fresh = True
        return self._host

    def push(self):
        """Copy the host mirror to the device if it may have been changed since it
        was read (a resume); nothing after a device update."""
        if self._host_fresh:
            self.flat.write(self._host)

    def pull(self):
        """Refresh the host mirror from the device."""
        self._host_fresh = False
        return self.values

    def state_dict(self):
        """name -> host array copy of every parameter."""
        vals = self.values
        return {n: self.layout.view(vals, i).copy() for i, n in enumerate(self.layout.names)}


class DeviceGradients(object):
    """One flat float32 device vector of gradients in the parameter layout."""

    def __init__(self, layout):
        self.layout = layout
        self.flat = device_zeros(layout.total)

    def view(self, i):
        """Parameter ``i``'s gradient (a view of :attr:`flat`)."""
        return self.layout.view(self.flat, i)

    def bucket(self, b):
        """Bucket ``b``'s gradients: a slice of :attr:`flat` (a view, no copy)."""
        return self.flat[b.start:b.stop]
