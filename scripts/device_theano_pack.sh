#!/bin/bash
# Pack what the lent GPU machine lacks for a Theano training step (docs/gpu.md, "Theano's
# stack on the lent machine"): its image has Python 3.12 and numpy 2.5, where the pinned
# stack does not run, and no iproute2 for emulated hosts. Writes, into .devscratch/ (add it
# to .git/info/exclude, carry it with the device's `run`):
#   py311.tar.xz  this checkout's .venv (a subset: numpy, scipy, Theano, h5py, mpi4py, the
#                 MPICH wheel's libraries and hydra) and the Python it was made with, without
#                 its test suite; unpacked there with `tar -C / -xJf`, at the same paths
#   netbin/       this machine's ip and tc with their libraries, run through the loader
# About 53 MB in all: the device carries 64 MiB with the working tree. Run as the user whose
# .venv it is, after `make install`; takes ~3 min (xz).
set -euo pipefail
cd "$(dirname "$0")/.."
V=$PWD/.venv
P=$(sed -n 's/^home = //p' "$V/pyvenv.cfg")/..        # the Python the venv was made with
P=$(cd "$P" && pwd)
X=$(basename "$(readlink -f "$V/bin/python3")")        # python3.11
SP=$V/lib/$X/site-packages
OUTD=$PWD/.devscratch
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
mkdir -p "$S$P/bin" "$S$P/lib" "$S$P/include" "$S$V/bin" "$S$SP" "$OUTD"
cp -a "$P/bin/$X" "$S$P/bin/"
ln -s "$X" "$S$P/bin/python3"
cp -a "$P"/lib/libpython3* "$S$P/lib/"
cp -a "$P/include/$X" "$S$P/include/"              # Theano compiles against Python.h
(cd "$P/lib" && tar -cf - --exclude="$X/test" --exclude="$X/idlelib" --exclude="$X/tkinter" \
    --exclude="$X/turtledemo" --exclude="$X/ensurepip" --exclude="$X/lib2to3" \
    --exclude="$X/site-packages" --exclude=__pycache__ --exclude="$X/config-3*" "$X") \
    | (cd "$S$P/lib" && tar -xf -)
cp -a "$V/pyvenv.cfg" "$S$V/"
cp -a "$V/bin/python" "$V/bin/python3" "$V/bin/$X" "$V"/bin/mpiexec* "$V/bin/mpirun" \
    "$V"/bin/hydra_* "$S$V/bin/"
cp -a "$V"/lib/libmpi.so* "$S$V/lib/"
[ -d "$V/lib/mpich" ] && cp -a "$V/lib/mpich" "$S$V/lib/"
# theano/tests is imported by theano itself; the other packages' tests are left out
(cd "$SP" && tar -cf - --exclude=__pycache__ --exclude='numpy/*/tests' --exclude='scipy/*/tests' \
    --exclude='h5py/tests' numpy numpy.libs scipy scipy.libs theano six.py mpi4py h5py h5py.libs \
    setuptools pkg_resources packaging _distutils_hack distutils-precedence.pth \
    numpy-*.dist-info scipy-*.dist-info theano-*.dist-info six-*.dist-info \
    mpi4py-*.dist-info h5py-*.dist-info setuptools-*.dist-info packaging-*.dist-info \
    mpich-*.dist-info) | (cd "$S$SP" && tar -xf -)
(cd "$S" && tar -cf - .) | xz -T0 -6 > "$OUTD/py311.tar.xz.part"
mv "$OUTD/py311.tar.xz.part" "$OUTD/py311.tar.xz"
# iproute2: the binaries and the libraries the system's loader would not find there
N=$OUTD/netbin
rm -rf "$N"; mkdir -p "$N/bin" "$N/real" "$N/lib"
for t in ip tc; do
    cp "$(command -v $t)" "$N/real/$t"
    ldd "$(command -v $t)" | awk '/=> \//{print $3}' | grep -v -E '/lib(c|m|dl|pthread|rt)\.so' \
        | xargs -r cp -L -t "$N/lib"
    printf '#!/bin/sh\n# %s with its own libraries, loaded without LD_LIBRARY_PATH (the commands\n# that "ip netns exec" runs must not inherit it).\nD=$(dirname "$(readlink -f "$0")")/..\nexec /lib64/ld-linux-x86-64.so.2 --library-path "$D/lib" "$D/real/%s" "$@"\n' \
        "$t" "$t" > "$N/bin/$t"
    chmod +x "$N/bin/$t"
done
du -sh "$OUTD/py311.tar.xz" "$N"
