"""Convert an image folder (or the embedded digits) to the HDF5 layout.

Source folder: one sub-folder per class (class names = sub-folder names,
sorted; label = position in that order), holding ``.jpg``/``.jpeg``/``.png``
files (any case). Hidden entries (``.name``) and files directly in the
source folder are ignored.

Each image is converted to RGB (``channels=3``) or grey (``channels=1``),
scaled so it *covers* the target size keeping its aspect ratio (for a square
target: shorter side = size) with PIL's bicubic filter (PIL anti-aliases
when shrinking), then centre-cropped to exactly ``size``. An image already
of the target size is stored unchanged (bit-exact for PNG).

Split: per class, the files (sorted by name) are permuted with
``numpy.random.RandomState(seed)`` and the first ``round(val_fraction * n)``
go to ``val``; both splits are stored in class order, then file-name order.
Images are streamed into the file, so the data set never has to fit in
memory; the file appears atomically at the end.

Command line: ``theanompi-ext convert SRC OUT --size 32 [--val-fraction
0.1] [--seed 0] [--channels 3]``; ``SRC`` = ``sklearn:digits`` writes the
embedded digits data set instead.
"""
import os
import sys

import numpy as np

from ..errors import DataError, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from .hdf5 import DatasetWriter, write_dataset

EXTENSIONS = ('.jpg', '.jpeg', '.png')
DIGITS_SOURCE = 'sklearn:digits'
_WRITE_BLOCK = 256


def _size2(size):
    if np.ndim(size) == 0:
        size = (size, size)
    h, w = (int(v) for v in size)
    if h < 1 or w < 1:
        raise ValueError('size must be positive, got %r' % (size,))
    return h, w


def scan_image_folder(src_dir):
    """Class names and, per class, the sorted image paths of ``src_dir``.

    Returns
    -------
    class_names : list of str
    files : list of list of str
    """
    src = os.fspath(src_dir)
    if not os.path.isdir(src):
        raise DataError('%s: no such directory' % src)
    entries = sorted(e for e in os.listdir(src) if not e.startswith('.'))
    classes = [e for e in entries if os.path.isdir(os.path.join(src, e))]
    if not entries:
        raise DataError('%s: the folder is empty' % src)
    if not classes:
        raise DataError('%s: no class sub-folders (expected one sub-folder of images '
                        'per class)' % src)
    files = []
    for name in classes:
        folder = os.path.join(src, name)
        found = sorted(
            os.path.join(folder, f) for f in os.listdir(folder)
            if not f.startswith('.') and f.lower().endswith(EXTENSIONS)
            and os.path.isfile(os.path.join(folder, f)))
        if not found:
            raise DataError('%s: class folder has no %s images'
                            % (folder, '/'.join(EXTENSIONS)))
        files.append(found)
    return classes, files


def split_files(files, val_fraction, seed):
    """Per-class deterministic train/val split of ``files`` (see module doc).

    Returns ``(train, val)``: lists of ``(path, label)`` pairs.
    """
    if not 0 <= val_fraction < 1:
        raise ValueError('val_fraction must be in [0, 1), got %r' % (val_fraction,))
    rng = np.random.RandomState(seed)
    train, val = [], []
    for label, paths in enumerate(files):
        perm = rng.permutation(len(paths))
        n_val = int(round(val_fraction * len(paths)))
        is_val = np.zeros(len(paths), bool)
        is_val[perm[:n_val]] = True
        for path, v in zip(paths, is_val):
            (val if v else train).append((path, label))
    return train, val


def load_image(path, size, channels=3):
    """Decode, resize-to-cover and centre-crop one image to uint8 (H, W, C).

    Raises
    ------
    DataError
        The file cannot be read or decoded (the message names it).
    """
    from PIL import Image
    h, w = _size2(size)
    try:
        with Image.open(path) as img:
            img.load()
            img = img.convert('RGB' if channels == 3 else 'L')
    except Exception as exc:  # PIL raises many types for bad files
        raise DataError('%s: unreadable image: %s' % (path, exc))
    iw, ih = img.size
    if (iw, ih) != (w, h):
        s = max(w / float(iw), h / float(ih))
        rw, rh = max(w, int(round(iw * s))), max(h, int(round(ih * s)))
        if (rw, rh) != (iw, ih):
            img = img.resize((rw, rh), Image.BICUBIC)
        left, top = (rw - w) // 2, (rh - h) // 2
        img = img.crop((left, top, left + w, top + h))
    arr = np.asarray(img, dtype=np.uint8)
    return arr.reshape(h, w, channels)


def convert_image_folder(src_dir, out_path, size=(32, 32), val_fraction=0.1, seed=0,
                         channels=3, compression=None):
    """Convert an image folder to the HDF5 layout.

    Parameters
    ----------
    src_dir : str
        One sub-folder per class of JPEG/PNG files.
    out_path : str
        Output HDF5 file (written atomically).
    size : int or (int, int)
        Output (H, W); an int means square.
    val_fraction : float
        Fraction of each class held out for ``val``, in [0, 1).
    seed : int
        Seed of the train/val split.
    channels : {3, 1}
        RGB or grey.
    compression : str or None
        Optional h5py filter for the images.

    Returns
    -------
    dict
        ``{'train': n_train, 'val': n_val, 'classes': n_classes}``.
    """
    if channels not in (1, 3):
        raise ValueError('channels must be 1 or 3, got %r' % (channels,))
    h, w = _size2(size)
    class_names, files = scan_image_folder(src_dir)
    train, val = split_files(files, val_fraction, seed)
    if not train:
        raise DataError('%s: no images left for the train split' % os.fspath(src_dir))
    sizes = {'train': len(train), 'val': len(val)}
    with DatasetWriter(out_path, (h, w, channels), class_names, sizes,
                       compression=compression) as writer:
        for split, items in (('train', train), ('val', val)):
            # Written in blocks: one h5py call per image would dominate.
            for start in range(0, len(items), _WRITE_BLOCK):
                block = items[start:start + _WRITE_BLOCK]
                imgs = np.stack([load_image(path, (h, w), channels) for path, _ in block])
                writer.write(split, start, imgs, np.array([lab for _, lab in block]))
    return {'train': len(train), 'val': len(val), 'classes': len(class_names)}


def digits_arrays(val_fraction=0.2, seed=0):
    """scikit-learn's digits as uint8 (N, 8, 8, 1) train/val arrays.

    Values 0..16 become ``round(v * 255 / 16)``. The split is the one of
    ``theanompi_ext.data.digits.load_digits``: a ``RandomState(seed)``
    permutation, the first ``round(val_fraction * N)`` in ``val``.

    Returns
    -------
    (x_train, y_train, x_val, y_val)
    """
    from sklearn.datasets import load_digits
    d = load_digits()
    x = np.rint(d.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    y = d.target.astype(np.int64)
    perm = np.random.RandomState(seed).permutation(len(y))
    n_val = int(round(len(y) * val_fraction))
    val, tr = perm[:n_val], perm[n_val:]
    return x[tr], y[tr], x[val], y[val]


def write_digits_h5(path, val_fraction=0.2, seed=0):
    """Write the embedded digits data set (10 classes '0'..'9') to ``path``.

    Returns
    -------
    str
        ``path``.
    """
    xt, yt, xv, yv = digits_arrays(val_fraction, seed)
    return write_dataset(path, xt, yt, xv, yv, [str(i) for i in range(10)])


# --------------------------------------------------------------------------- CLI

def _parse_size(text):
    try:
        parts = [int(p) for p in text.lower().split('x')]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or min(parts) < 1:
        import argparse
        raise argparse.ArgumentTypeError('size must be N or HxW, got %r' % text)
    return tuple(parts)


def register(subparsers):
    """Add the ``convert`` sub-command to an argparse ``subparsers``."""
    p = subparsers.add_parser(
        'convert', help='convert an image folder to the HDF5 layout',
        description='Convert an image folder (one sub-folder per class) to the '
                    'HDF5 layout of theanompi_ext.data.hdf5. SRC = %s writes the '
                    'embedded digits data set.' % DIGITS_SOURCE)
    p.add_argument('src', metavar='SRC',
                   help='image folder with one sub-folder per class, or %s for the '
                        'built-in digits' % DIGITS_SOURCE)
    p.add_argument('out', metavar='OUT', help='the HDF5 file to write (.h5)')
    p.add_argument('--size', type=_parse_size, default=(32, 32), metavar='N|HxW',
                   help='side (N) or height x width of the stored images, pixels '
                        '(default 32)')
    p.add_argument('--val-fraction', type=float, default=None, metavar='FRACTION',
                   help='fraction of each class held out for validation, in [0, 1) '
                        '(default 0.1; 0.2 for digits)')
    p.add_argument('--seed', type=int, default=0, metavar='N',
                   help='random seed of the train/validation split (default 0)')
    p.add_argument('--channels', type=int, choices=(1, 3), default=3,
                   help='colour channels stored, one of %(choices)s: 3 = RGB, 1 = grey '
                        '(default 3)')
    p.set_defaults(func=run)
    return p


def run(args):
    """Run the ``convert`` command; returns the exit status.

    2: bad input (the source, an option); 3: the output could not be written
    (a full disk, no permission), with one line naming the path and the
    cause. The writing runs in a child process (``files.isolated.run_isolated``), so
    even a crash inside HDF5 ends as that one line, with no temporary file left.
    """
    from ..errors import WriteError
    from ..files.isolated import run_isolated
    digits = args.src == DIGITS_SOURCE and not os.path.exists(args.src)
    try:
        if digits:
            frac = 0.2 if args.val_fraction is None else args.val_fraction
            run_isolated(lambda: write_digits_h5(args.out, val_fraction=frac, seed=args.seed),
                         args.out, 'the data set')
            print('%s: digits written' % args.out)
            return EXIT_OK
        info = run_isolated(lambda: convert_image_folder(
            args.src, args.out, size=args.size,
            val_fraction=0.1 if args.val_fraction is None else args.val_fraction,
            seed=args.seed, channels=args.channels), args.out, 'the data set')
    except WriteError as exc:
        sys.stderr.write('theanompi-ext convert: error: %s\n' % exc)
        return EXIT_FAILED
    except (DataError, ValueError, OSError) as exc:
        sys.stderr.write('theanompi-ext convert: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    print('%s: %d train, %d val images, %d classes'
          % (args.out, info['train'], info['val'], info['classes']))
    return EXIT_OK


def main(argv=None):
    """``theanompi-ext convert`` as a stand-alone entry point."""
    import argparse
    parser = argparse.ArgumentParser(prog='theanompi-ext')
    register(parser.add_subparsers(dest='command', metavar='COMMAND'))
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != 'convert':
        argv = ['convert'] + argv
    return run(parser.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
