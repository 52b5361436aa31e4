"""update/policy.py: the local (BN) tail's scale, on the host and as the device's vector."""
import numpy as np
import pytest


def test_scale_local_tail_and_its_device_vector():
    """The host scaling and the device update's per-entry vector are the same numbers."""
    from theanompi_ext.update.policy import local_scale_vector, scale_local_tail
    g = np.array([3, 3, 3, 3], np.float32)
    assert scale_local_tail(g, 1, 2.5) is g
    np.testing.assert_array_equal(g, [3, 7.5, 7.5, 7.5])
    np.testing.assert_array_equal(local_scale_vector(4, 1, 2.5), [1, 2.5, 2.5, 2.5])
    h = np.array([3, 3], np.float32)
    scale_local_tail(h, 2, 8)                 # everything exchanged: nothing to scale
    np.testing.assert_array_equal(h, [3, 3])
    scale_local_tail(h, 0, 1)                 # scale 1 changes nothing
    np.testing.assert_array_equal(h, [3, 3])
    g = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(scale_local_tail(g.copy(), 1, 3) / local_scale_vector(4, 1, 3),
                                  g)
    with pytest.raises(ValueError, match='5 exchanged entries of 4'):
        local_scale_vector(4, 5, 2)
