"""Link Debian's pygpu (python3-pygpu) into the project's venv (``make gpu-deps``).

Only pygpu's own package directories are linked (pygpu and the two it
imports, mako and markupsafe), into ``.venv/gpu-site``, which one ``.pth``
file adds to the venv's path *after* its site-packages: nothing else from
``/usr/lib/python3/dist-packages`` (numpy 1.24, pip, ...) can shadow the
venv's pinned packages. Run with the venv's python; exits 1 with the reason
when pygpu then does not import.
"""
import os
import subprocess
import sys
import sysconfig

DIST = '/usr/lib/python3/dist-packages'
PACKAGES = ('pygpu', 'mako', 'markupsafe')


def main():
    """Create the links and the .pth; check the import in a fresh interpreter."""
    site = sysconfig.get_paths()['purelib']
    target = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(site))), 'gpu-site') \
        if site.endswith('site-packages') else os.path.join(site, 'gpu-site')
    os.makedirs(target, exist_ok=True)
    for name in PACKAGES:
        src = os.path.join(DIST, name)
        if not os.path.isdir(src):
            sys.stderr.write('link_pygpu: %s is missing (apt-get install python3-pygpu)\n' % src)
            return 1
        link = os.path.join(target, name)
        if os.path.islink(link):
            os.unlink(link)
        os.symlink(src, link)
    with open(os.path.join(site, 'theanompi_ext_gpu.pth'), 'w') as f:
        f.write(target + '\n')
    check = subprocess.run([sys.executable, '-c', 'import numpy, pygpu; '
                            'print(pygpu.__version__, numpy.__version__, numpy.__file__)'],
                           capture_output=True, text=True)
    if check.returncode != 0:
        sys.stderr.write('link_pygpu: pygpu does not import:\n%s' % check.stderr)
        return 1
    version, np_version, np_file = check.stdout.split()
    if not np_file.startswith(site):
        sys.stderr.write('link_pygpu: numpy now comes from %s, not the venv\n' % np_file)
        return 1
    print('link_pygpu: pygpu %s linked into %s (numpy %s from the venv)'
          % (version, target, np_version))
    return 0


if __name__ == '__main__':
    sys.exit(main())
