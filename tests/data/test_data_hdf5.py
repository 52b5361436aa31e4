"""HDF5 layout: writer, reader validation, image-folder converter, digits."""
import os

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from theanompi_ext.data import convert
from theanompi_ext.data.hdf5 import DataError, open_dataset, write_dataset


def _arrays(n_train=12, n_val=4, shape=(5, 6, 3), k=3, seed=0):
    rng = np.random.RandomState(seed)
    return (rng.randint(0, 256, (n_train,) + shape).astype(np.uint8),
            rng.randint(0, k, n_train),
            rng.randint(0, 256, (n_val,) + shape).astype(np.uint8),
            rng.randint(0, k, n_val),
            ['c%d' % i for i in range(k)])


@pytest.fixture
def good(tmp_path):
    path = str(tmp_path / 'data.h5')
    arrays = _arrays()
    write_dataset(path, *arrays)
    return path, arrays


def _read(path):
    with open(path, 'rb') as f:
        return f.read()


def _expect(path, *words):
    with pytest.raises(DataError) as info:
        open_dataset(path)
    msg = str(info.value)
    assert os.fspath(path) in msg
    for word in words:
        assert word in msg, msg
    return msg


# --------------------------------------------------------------------------- round trip

def test_round_trip(good):
    path, (xt, yt, xv, yv, names) = good
    with open_dataset(path) as ds:
        assert ds.class_names == names and ds.n_classes == 3
        assert ds.image_shape == (5, 6, 3)
        assert len(ds.train) == 12 and len(ds.val) == 4
        np.testing.assert_array_equal(ds.train.labels, yt)
        assert ds.train.labels.dtype == np.int64
        idx = [7, 2, 2, 11, 0]
        x, y = ds.train.get_batch(idx)
        assert x.dtype == np.uint8
        np.testing.assert_array_equal(x, xt[idx])
        np.testing.assert_array_equal(y, yt[idx])
        # Sparse indices take the point-selection path.
        x, y = ds.val.get_batch([3, 0])
        np.testing.assert_array_equal(x, xv[[3, 0]])
        flat = xt.reshape(-1, 3) / 255.0
        np.testing.assert_allclose(ds.mean, flat.mean(0), rtol=1e-5)
        np.testing.assert_allclose(ds.std, flat.std(0), rtol=1e-5)
        assert ds.mean.dtype == np.float32
    ds = open_dataset(path, in_memory=True)
    assert isinstance(ds.train.images, np.ndarray)
    np.testing.assert_array_equal(ds.val.get_batch([1, 2])[0], xv[[1, 2]])


def test_write_is_atomic_and_leaves_no_temp(tmp_path, good):
    path, arrays = good
    before = _read(path)
    xt, yt, xv, yv, names = arrays
    with pytest.raises(DataError, match='labels'):
        write_dataset(path, xt, yt + 10, xv, yv, names)  # bad labels: nothing replaced
    assert _read(path) == before
    assert os.listdir(os.path.dirname(path)) == ['data.h5']


def test_writer_rejects_bad_input(tmp_path):
    xt, yt, xv, yv, names = _arrays()
    path = str(tmp_path / 'w.h5')
    with pytest.raises(DataError, match='uint8'):
        write_dataset(path, xt.astype(np.float32), yt, xv, yv, names)
    with pytest.raises(DataError, match='4-D'):
        write_dataset(path, xt[0], yt, xv, yv, names)
    with pytest.raises(DataError, match='C in'):
        write_dataset(path, xt[..., :2], yt, xv[..., :2], yv, names)
    assert not os.path.exists(path)


# --------------------------------------------------------------------------- bad files

def test_missing_file(tmp_path):
    _expect(str(tmp_path / 'nope.h5'), 'no such file')


def test_corrupt_file(tmp_path):
    path = tmp_path / 'junk.h5'
    path.write_bytes(np.random.RandomState(1).bytes(4096))
    _expect(str(path), 'not a readable HDF5 file')


def test_truncated_file(good):
    path, _ = good
    data = _read(path)
    with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])
    _expect(path, 'truncated')


def _edit(path, fn):
    with h5py.File(path, 'a') as f:
        fn(f)


@pytest.mark.parametrize('key', ['train/labels', 'val/images', 'mean', 'std', 'class_names'])
def test_missing_dataset(good, key):
    path, _ = good
    _edit(path, lambda f: f.__delitem__(key))
    _expect(path, "missing dataset '%s'" % key)


def test_missing_group_and_version(good):
    path, _ = good
    _edit(path, lambda f: f.attrs.__delitem__('format_version'))
    _expect(path, "'format_version'")
    _edit(path, lambda f: f.attrs.__setitem__('format_version', 1))
    _edit(path, lambda f: f.__delitem__('val'))
    _expect(path, "missing group 'val'")


def test_labels_out_of_range(good):
    path, _ = good

    def bad(f):
        f['train/labels'][5] = 3
    _edit(path, bad)
    msg = _expect(path, "'train/labels'", '[0, 3)', 'index 5')
    assert 'n_classes' in msg

    def neg(f):
        f['train/labels'][5] = -1
    _edit(path, neg)
    _expect(path, "'train/labels'")


def _replace(key, value):
    def fn(f):
        del f[key]
        f[key] = value
    return fn


@pytest.mark.parametrize('key, value, words', [
    ('train/images', np.zeros((12, 5, 6, 3), np.float32), ['uint8']),
    ('train/images', np.zeros((12, 5, 6), np.uint8), ['4-D']),
    ('train/images', np.zeros((12, 5, 6, 2), np.uint8), ['C in {1, 3}']),
    ('val/images', np.zeros((4, 5, 7, 3), np.uint8), ['image shape']),
    ('train/labels', np.zeros(12, np.float64), ['int64']),
    ('train/labels', np.zeros((12, 1), np.int64), ['1-D']),
    ('val/labels', np.zeros(5, np.int64), ['5 entries']),
    ('mean', np.zeros(1, np.float32), ['(3,)']),
    ('std', np.array([0.1, 0.0, 0.1], np.float32), ['> 0']),
    ('std', np.array([0.1, np.nan, 0.1], np.float32), ['non-finite']),
    ('class_names', np.arange(3), ['strings']),
])
def test_wrong_field(good, key, value, words):
    path, _ = good
    _edit(path, _replace(key, value))
    _expect(path, "'%s'" % key, *words)


# --------------------------------------------------------------------------- fuzz

@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=3000), keep_header=st.booleans())
def test_fuzz_bytes_only_data_error(tmp_path, data, keep_header):
    path = str(tmp_path / 'fuzz.h5')
    with open(path, 'wb') as f:
        if keep_header:  # an HDF5 signature gets the bytes past the first check
            f.write(b'\x89HDF\r\n\x1a\n')
        f.write(data)
    with pytest.raises(DataError):
        open_dataset(path)


_KEYS = ['train/images', 'train/labels', 'val/images', 'val/labels',
         'mean', 'std', 'class_names']
_DTYPES = [np.uint8, np.int64, np.int8, np.float32, np.float64, np.bool_]


@st.composite
def _field(draw):
    kind = draw(st.sampled_from(['missing', 'array', 'array', 'strings']))
    if kind != 'array':
        return kind
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=5)))
    dtype = draw(st.sampled_from(_DTYPES))
    vals = np.random.RandomState(draw(st.integers(0, 2 ** 16))).randint(-3, 5, size=shape)
    return vals.astype(dtype)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changed=st.dictionaries(st.sampled_from(_KEYS), _field(), max_size=3),
       version=st.sampled_from([1, 1, 1, 1, None, 2, 'one', 1.5]),
       truncate=st.sampled_from([None] * 4) | st.floats(0.0, 1.0))
def test_fuzz_structure_only_data_error(tmp_path, changed, version, truncate):
    """A valid small file with up to 3 fields replaced by random arrays,
    strings or nothing, maybe a bad version, maybe truncated."""
    path = str(tmp_path / 'fuzz.h5')
    xt, yt, xv, yv, names = _arrays(n_train=4, n_val=2, shape=(2, 2, 1))
    fields = {'train/images': xt, 'train/labels': yt, 'val/images': xv,
              'val/labels': yv, 'mean': np.full(1, .5, np.float32),
              'std': np.full(1, .2, np.float32), 'class_names': names}
    fields.update(changed)
    with h5py.File(path, 'w') as f:
        if version is not None:
            f.attrs['format_version'] = version
        for key, value in fields.items():
            if isinstance(value, str) and value == 'missing':
                continue
            if isinstance(value, str) and value == 'strings':
                value = ['x', 'yy']
            if isinstance(value, list):
                f.create_dataset(key, data=np.array(value, dtype=object),
                                 dtype=h5py.string_dtype())
            else:
                f[key] = value
    if truncate is not None:
        data = _read(path)
        with open(path, 'wb') as f:
            f.write(data[:int(len(data) * truncate)])
    try:
        ds = open_dataset(path)
    except DataError as exc:
        assert path in str(exc)
    else:
        assert len(ds.train) >= 1
        ds.train.get_batch(np.arange(len(ds.train)))
        ds.close()


# --------------------------------------------------------------------------- converter

def _make_folder(root, size=(6, 5)):
    """Two classes of PNGs of exactly ``size`` (W, H) plus larger JPEGs."""
    from PIL import Image
    rng = np.random.RandomState(3)
    pngs = {}
    for ci, cname in enumerate(['cat', 'dog']):
        folder = root / cname
        folder.mkdir(parents=True)
        for i in range(5):
            arr = rng.randint(0, 256, (size[1], size[0], 3)).astype(np.uint8)
            name = folder / ('p%d.png' % i)
            Image.fromarray(arr).save(str(name))
            pngs[arr.tobytes()] = ci
        for i in range(2):
            arr = np.full((20, 31, 3), 40 * (ci + 1), np.uint8)
            Image.fromarray(arr).save(str(folder / ('j%d.JPG' % i)), quality=95)
    (root / 'README.txt').write_text('ignored')
    (root / 'cat' / 'notes.txt').write_text('ignored')
    return pngs


def test_convert_round_trip(tmp_path):
    pngs = _make_folder(tmp_path / 'src')
    out = str(tmp_path / 'out.h5')
    info = convert.convert_image_folder(str(tmp_path / 'src'), out, size=(5, 6),
                                        val_fraction=0.3, seed=1)
    assert info == {'train': 10, 'val': 4, 'classes': 2}
    with open_dataset(out) as ds:
        assert ds.class_names == ['cat', 'dog']
        assert ds.image_shape == (5, 6, 3)
        assert len(ds.train) == 10 and len(ds.val) == 4
        seen = 0
        for split in (ds.train, ds.val):
            x, y = split.get_batch(np.arange(len(split)))
            assert list(y) == sorted(y)  # stored in class order
            for img, label in zip(x, y):
                key = img.tobytes()
                if key in pngs:  # PNGs of the target size are stored exactly
                    assert pngs[key] == label
                    seen += 1
                else:  # a resized/cropped constant JPEG stays ~constant
                    assert abs(img.astype(int) - 40 * (label + 1)).max() <= 3
        assert seen == 10
    # Same seed -> same file content; the split depends on the seed.
    out2 = str(tmp_path / 'out2.h5')
    convert.convert_image_folder(str(tmp_path / 'src'), out2, size=(5, 6),
                                 val_fraction=0.3, seed=1)
    with open_dataset(out) as a, open_dataset(out2) as b:
        np.testing.assert_array_equal(a.val.images[:], b.val.images[:])


def test_convert_grey_and_square(tmp_path):
    _make_folder(tmp_path / 'src')
    out = str(tmp_path / 'g.h5')
    convert.convert_image_folder(str(tmp_path / 'src'), out, size=4, val_fraction=0,
                                 channels=1)
    with open_dataset(out) as ds:
        assert ds.image_shape == (4, 4, 1) and len(ds.val) == 0 and len(ds.train) == 14


def test_convert_errors(tmp_path):
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(DataError, match='empty'):
        convert.convert_image_folder(str(empty), str(tmp_path / 'o.h5'))
    (empty / 'a.png').write_bytes(b'')
    with pytest.raises(DataError, match='no class sub-folders'):
        convert.convert_image_folder(str(empty), str(tmp_path / 'o.h5'))
    src = tmp_path / 'src'
    _make_folder(src)
    bad = src / 'dog' / 'broken.png'
    bad.write_bytes(b'not a png at all')
    with pytest.raises(DataError) as info:
        convert.convert_image_folder(str(src), str(tmp_path / 'o.h5'), size=5)
    assert str(bad) in str(info.value)
    assert not os.path.exists(str(tmp_path / 'o.h5'))
    assert not [f for f in os.listdir(str(tmp_path)) if f.endswith('.tmp')]


def test_convert_cli(tmp_path, capsys):
    import argparse
    _make_folder(tmp_path / 'src')
    out = str(tmp_path / 'cli.h5')
    parser = argparse.ArgumentParser()
    convert.register(parser.add_subparsers(dest='command'))
    args = parser.parse_args(['convert', str(tmp_path / 'src'), out, '--size', '8x6'])
    assert args.func(args) == 0
    with open_dataset(out) as ds:
        assert ds.image_shape == (8, 6, 3)
    assert convert.main(['convert', str(tmp_path / 'missing'), out]) == 2
    assert 'missing' in capsys.readouterr().err


def test_write_digits_h5(tmp_path):
    path = str(tmp_path / 'digits.h5')
    convert.write_digits_h5(path)
    with open_dataset(path) as ds:
        assert ds.n_classes == 10 and ds.class_names == [str(i) for i in range(10)]
        assert ds.image_shape == (8, 8, 1)
        assert len(ds.train) + len(ds.val) == 1797 and len(ds.val) == 359
        x, _ = ds.train.get_batch(np.arange(len(ds.train)))
        assert x.max() == 255 and x.min() == 0
        assert set(np.unique(ds.val.labels)) == set(range(10))
        # Same split (and order) as the in-memory digits loader.
        from theanompi_ext.data.digits import load_digits
        ref = load_digits()
        np.testing.assert_array_equal(ds.val.labels, ref.y_val)
        np.testing.assert_array_equal(ds.train.labels, ref.y_train)
