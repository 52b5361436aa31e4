"""The OpenCL device of the device tests (pygpu + pocl, `make gpu-deps`)."""
import subprocess
import sys

OPENCL_DEVICE = 'opencl0:0'


def opencl_unavailable():
    """Why the OpenCL device cannot run here (None when it can), in a subprocess
    so that this process's Theano stays on the CPU."""
    code = '\n'.join([
        'import sys',
        'try:',
        '    import pygpu',
        'except ImportError as e:',
        '    sys.exit("pygpu is not installed (" + str(e) + ")")',
        'try:',
        '    pygpu.init(sys.argv[1])',
        'except Exception as e:',
        '    sys.exit("pygpu cannot open " + sys.argv[1] + ": " + str(e))'])
    res = subprocess.run([sys.executable, '-c', code, OPENCL_DEVICE], capture_output=True,
                         text=True)
    return None if res.returncode == 0 else (res.stderr.strip() or 'exit %d' % res.returncode)
