"""The arithmetic of a 16-bit wire: casts, float32 sums, range checks, error bounds.

A gradient bucket is float32. With ``wire='float16'`` or ``'bfloat16'`` it
travels as 16-bit values and is summed in float32 (never accumulated in 16
bits across ranks), then cast back. Everything here is plain array code,
no MPI: the collective layer moves the 16-bit values.

Representation: every 16-bit wire value is held as ``uint16`` (numpy has
no bfloat16, and MPI moves both formats as ``MPI.UINT16_T``):

``float16``   IEEE binary16 bits, round-to-nearest-even (numpy's cast's bits,
              computed by :func:`float32_to_float16`);
              largest finite value 65504, unit roundoff 2**-11.
``bfloat16``  the upper half of float32's bits, rounded to nearest even by
              :func:`float32_to_bfloat16`; float32's range (~3.4e38), unit
              roundoff 2**-8.

Overflow (``docs/performance.md``, "16-bit wire"): a value beyond the 16-bit
range becomes inf (IEEE rounding), and so does its sum. It is *detected*,
not scaled away: :func:`nonfinite_count` finds it in the exchanged result,
which is identical on every rank, so every rank stops at the same bucket
(:class:`~theanompi_ext.errors.WireOverflow`).

Memory: on the host the casts work in blocks of :data:`BLOCK` elements, so
their temporaries are bounded; the caller holds one 16-bit copy of the
bucket. Given a device array module (``xp``, CuPy) they make one pass and
never wait for the device.
"""
import numpy as np

WIRE_DTYPES = ('float32', 'float16', 'bfloat16')
#: Elements per block of a cast (bounds its temporaries: under 1 MB, 13 bytes an element).
BLOCK = 1 << 16

# unit roundoff (half an ulp at 1), smallest positive subnormal, largest finite
_UNIT = {'float32': 2.0 ** -24, 'float16': 2.0 ** -11, 'bfloat16': 2.0 ** -8}
_TINY = {'float32': 2.0 ** -149, 'float16': 2.0 ** -24, 'bfloat16': 2.0 ** -133}
_MAX = {'float32': float(np.finfo(np.float32).max), 'float16': 65504.0,
        'bfloat16': float(np.uint32(0x7F7F0000).view(np.float32))}
# exponent bits of the 16-bit formats: all ones means inf or nan
_EXP_MASK = {'float16': 0x7C00, 'bfloat16': 0x7F80}


def check_wire_dtype(name):
    """``name`` if it is a wire dtype, else ValueError listing them."""
    if name not in WIRE_DTYPES:
        raise ValueError('unknown wire dtype %r; choose from %s'
                         % (name, ', '.join(WIRE_DTYPES)))
    return name


def unit_roundoff(wire):
    """Relative rounding error bound of one cast to ``wire`` (normal range)."""
    return _UNIT[check_wire_dtype(wire)]


def max_finite(wire):
    """Largest finite value of ``wire``."""
    return _MAX[check_wire_dtype(wire)]


def _flat_float32(out):
    """Whether the casts can write ``out``'s memory through a flat uint32 view."""
    return out.dtype == np.float32 and out.flags.c_contiguous


def _blocks(n, xp=np):
    """Slices of at most :data:`BLOCK` elements for numpy; one slice for a
    device module (CuPy), where each block would cost kernel launches and
    bounded host temporaries are not the point."""
    if xp is not np:
        yield slice(0, n)
        return
    for lo in range(0, n, BLOCK):
        yield slice(lo, min(n, lo + BLOCK))


def float32_to_bfloat16(x, out=None, xp=np):
    """bfloat16 bits (uint16) of float32 ``x``, rounded to nearest, ties to even.

    NaN stays NaN (quiet, sign kept); values that round beyond the largest
    bfloat16 become inf, as IEEE rounding does. ``xp``: the array module
    (numpy; CuPy for a bucket on a GPU, where nothing here waits for the
    device: the casts are queued on the current stream and the host goes
    on, as the comm stream's sum needs).
    """
    x = xp.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = xp.empty(x.size, np.uint16) if out is None else out
    bits = x.view(np.uint32)
    for s in _blocks(x.size, xp):
        u = bits[s]
        # Adding 0x7FFF plus the lowest kept bit, then truncating, rounds
        # to nearest with ties to the even neighbour; a carry into the
        # exponent is the correct next binade (or inf past the largest).
        r = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
        nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        if xp is np:
            if nan.any():       # rare: index only then
                r[nan] = (u[nan] >> np.uint32(16)) | np.uint32(0x0040)
        else:
            # On a device, asking whether any is NaN would wait for the
            # GPU (46 ms a 64 MB bucket on an H200, in blocks): select.
            r = xp.where(nan, (u >> np.uint32(16)) | np.uint32(0x0040), r)
        out[s] = r
    return out


def bfloat16_to_float32(w, out=None, xp=np):
    """float32 values of bfloat16 bits ``w`` (exact); ``xp`` as above."""
    w = xp.asarray(w, dtype=np.uint16).reshape(-1)
    if out is not None and not _flat_float32(out):
        out[...] = bfloat16_to_float32(w, xp=xp).reshape(out.shape)
        return out
    out = xp.empty(w.size, np.float32) if out is None else out
    bits = out.reshape(-1).view(np.uint32)
    for s in _blocks(w.size, xp):
        xp.left_shift(w[s], 16, out=bits[s], dtype=np.uint32)
    return out


# float32 bit patterns of the float16 limits
_U = np.uint32
_F16_MIN_NORMAL = _U(0x38800000)    # 2**-14: below it a float16 is subnormal (or zero)
_F16_OVERFLOW = _U(0x47800000)      # 65536: from here on the float16 is inf (or nan)
_F32_INF = _U(0x7F800000)
_REBIAS = _U(0x38000000)            # (127 - 15) << 23: float32 exponent -> float16's
_ROUND_REBIAS = _U((0xFFF - 0x38000000) % (1 << 32))   # + 0xFFF - _REBIAS, mod 2**32


def float32_to_float16(x, out=None):
    """IEEE binary16 bits (uint16) of float32 ``x``, rounded to nearest, ties to even.

    The same bits as numpy's cast (NaN payloads included, tested on every
    float16 boundary), computed with integer and float32 array arithmetic:
    numpy's own cast sets the floating-point underflow status once per
    value that becomes subnormal or zero, which costs ~80 ns a value, and
    most gradient entries are that small (a 36,864-entry ResNet-20 bucket:
    3 ms instead of 0.1 ms, on the training thread, between backward chunks).
    """
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(x.size, np.uint16) if out is None else out
    bits = x.view(np.uint32)
    n = min(x.size, BLOCK)
    a_, r_, t_ = (np.empty(n, np.uint32) for _ in range(3))
    m_ = np.empty(n, bool)
    for s in _blocks(x.size):
        u = bits[s]
        a, r, t, m = a_[:u.size], r_[:u.size], t_[:u.size], m_[:u.size]
        np.bitwise_and(u, _U(0x7FFFFFFF), out=a)
        # Normal range: rebias the exponent (wrapping below 2**-14, where the
        # subnormal result replaces it) and round the 13 dropped bits to
        # nearest, ties to the even neighbour (0xFFF plus the lowest kept
        # bit); a carry is the next binade, up to inf from 65520 on.
        np.right_shift(a, _U(13), out=r)
        np.bitwise_and(r, _U(1), out=r)
        r += a
        r += _ROUND_REBIAS           # wraps: unsigned arithmetic mod 2**32
        r >>= _U(13)
        np.less(a, _F16_MIN_NORMAL, out=m)
        if m.any():
            # Adding 0.5 puts the float16 subnormal step (2**-24) at
            # float32's last bit, so the float32 addition rounds (to
            # nearest even) exactly as the float16 cast must.
            with np.errstate(invalid='ignore'):     # the nan lanes, not kept
                np.add(a.view(np.float32), np.float32(0.5), out=t.view(np.float32))
            t -= _U(0x3F000000)
            np.copyto(r, t, where=m)
        np.greater_equal(a, _F16_OVERFLOW, out=m)
        if m.any():
            np.copyto(r, _float16_specials(a), where=m)
        np.right_shift(u, _U(16), out=t)
        t &= _U(0x8000)
        r |= t
        out[s] = r
    return out


def _float16_specials(a):
    """float16 bits for |float32| bits ``a`` at or beyond 65536: inf for overflow and
    inf; a NaN keeps the top of its payload (and at least one bit of it), as
    numpy's cast does."""
    nan = a > _F32_INF
    special = np.where(nan, _U(0x7C00) + ((a & _U(0x7FFFFF)) >> _U(13)), _U(0x7C00))
    special[nan & (special == _U(0x7C00))] = 0x7C01
    return special


def float16_to_float32(w, out=None):
    """float32 values of IEEE binary16 bits ``w`` (exact; numpy's values, NaN
    payloads included), in array arithmetic for the same reason as
    :func:`float32_to_float16`: numpy's cast is slow on subnormals."""
    w = np.asarray(w, dtype=np.uint16).reshape(-1)
    if out is not None and not _flat_float32(out):
        out[...] = float16_to_float32(w).reshape(out.shape)
        return out
    out = np.empty(w.size, np.float32) if out is None else out
    bits = out.reshape(-1).view(np.uint32)
    n = min(w.size, BLOCK)
    h_, e_, t_ = (np.empty(n, np.uint32) for _ in range(3))
    m_ = np.empty(n, bool)
    for s in _blocks(w.size):
        o = bits[s]                      # built in place
        h, e, t, m = h_[:o.size], e_[:o.size], t_[:o.size], m_[:o.size]
        np.copyto(h, w[s])
        np.bitwise_and(h, _U(0x7FFF), out=o)
        o <<= _U(13)
        np.bitwise_and(o, _U(0x0F800000), out=e)
        o += _REBIAS
        np.equal(e, _U(0x0F800000), out=m)
        if m.any():                      # inf and nan: float32's all-ones exponent
            o[m] += _REBIAS
        np.equal(e, 0, out=m)
        if m.any():
            # m * 2**-24 = (1 + m / 1024) * 2**-14 - 2**-14, exact in float32
            np.add(o, _U(0x00800000), out=t)
            with np.errstate(invalid='ignore'):     # the nan lanes, not kept
                np.subtract(t.view(np.float32), np.float32(2.0 ** -14), out=t.view(np.float32))
            np.copyto(o, t, where=m)
        np.bitwise_and(h, _U(0x8000), out=t)
        t <<= _U(16)
        o |= t
    return out


def encode(x, wire, out=None):
    """The 16-bit wire bits (uint16) of float32 ``x``; ``out`` is reused if given."""
    if wire == 'bfloat16':
        return float32_to_bfloat16(x, out)
    if wire != 'float16':
        raise ValueError('encode: %r is not a 16-bit wire dtype' % (wire,))
    return float32_to_float16(x, out)


def decode(w, wire, out=None):
    """float32 values of wire bits ``w`` (exact: every 16-bit value is a float32)."""
    if wire == 'bfloat16':
        return bfloat16_to_float32(w, out)
    if wire != 'float16':
        raise ValueError('decode: %r is not a 16-bit wire dtype' % (wire,))
    return float16_to_float32(w, out)


def sum_encoded(parts, wire, out=None):
    """float32 sum of the rows of ``parts`` (k x c wire bits), in rank order.

    Each row is decoded exactly and added in float32: no partial sum is
    ever rounded to 16 bits.
    """
    parts = np.asarray(parts, dtype=np.uint16)
    k, c = parts.shape
    out = np.zeros(c, np.float32) if out is None else out
    out[...] = 0
    term = np.empty(min(c, BLOCK), np.float32)
    for s in _blocks(c):
        t = term[:s.stop - s.start]
        for r in range(k):
            decode(parts[r, s], wire, t)
            out[s] += t
    return out


def nonfinite_count(w, wire):
    """How many of the wire bits ``w`` are inf or nan."""
    mask = np.uint16(_EXP_MASK[wire])
    w = np.asarray(w, dtype=np.uint16).reshape(-1)
    return int(sum(np.count_nonzero((w[s] & mask) == mask) for s in _blocks(w.size)))


def chunk_counts(n, k):
    """Sizes of the k chunks of an n-element bucket (the first n % k one longer)."""
    base, extra = divmod(int(n), int(k))
    return [base + (1 if r < extra else 0) for r in range(k)]


def sum_error_bound(abs_sum, abs_result, k, wire, intermediate_roundings=0):
    """Elementwise bound on |exchanged - exact sum| for one bucket element.

    ``abs_sum``: sum over ranks of |x_r|; ``abs_result``: |exact sum|;
    ``k`` ranks. Each input cast errs by at most u*|x_r| (+ half the
    smallest subnormal), the float32 sum by (k-1) * 2**-24 * sum|x_r|, the
    cast back by u*|result| (+ the same), and an allreduce whose partial
    sums are re-rounded to 16 bits (``intermediate_roundings`` = k - 1 for
    the reduction-operator method) by u*sum|x_r| per rounding.
    """
    u = unit_roundoff(wire)
    tiny = _TINY[wire] / 2.0
    abs_sum = np.asarray(abs_sum, dtype=np.float64)
    abs_result = np.asarray(abs_result, dtype=np.float64)
    # every term above to first order, with a 1% slack for second-order terms
    bound = (u * (1 + intermediate_roundings) + (k - 1) * 2.0 ** -24) * abs_sum \
        + u * abs_result + (k + 1 + intermediate_roundings) * tiny
    return bound * 1.01


def describe_overflow(name, wire, bad_result, bad_local, largest_local):
    """The message of a :class:`~theanompi_ext.errors.WireOverflow`: where, what, and what to do."""
    return ('bucket %s: %d value(s) of the exchanged sum are inf or nan on the %s wire '
            '(largest finite %s: %.6g); this rank\'s own gradient had %d non-finite '
            'value(s) after the cast (its largest |value| %.6g). Either a gradient is '
            'beyond the %s range or training diverged; use --wire-dtype bfloat16 '
            '(float32\'s range) or float32'
            % (name, bad_result, wire, wire, max_finite(wire), bad_local, largest_local,
               wire))
