"""Theano's compile cache serves every process (engine/core._stable_cache_keys).

Theano 1.0.5 keyed two kinds of C module by something that changes from
process to process (Python 3's salted ``hash()``; an op's empty
``__props__`` taken for "unversioned"), so every process compiled them again.
Here a graph with each kind (a DimShuffle, a Softmax, an Alloc) is compiled
in one process (into the suite's cache: it may be there already), then in two
more under other hash salts: those compile nothing and add nothing to the cache.
"""
import json
import os
import subprocess
import sys

# Counts g++ runs (Theano's compile_str) while it compiles the graph.
SCRIPT = r'''
import json, sys
from theanompi_ext.engine.core import T, function, theano
from theano.gof import cmodule
compiled = []
original = cmodule.GCC_compiler.compile_str
def counting(module_name, *args, **kwargs):
    compiled.append(module_name)
    return original(module_name, *args, **kwargs)
cmodule.GCC_compiler.compile_str = staticmethod(counting)
x = T.matrix('x')
n = T.iscalar('n')
# x.dimshuffle: a DimShuffle (a COp); softmax: __props__ == (); T.alloc: the same
y = T.nnet.softmax(x * 2) + T.alloc(x.dimshuffle(1, 0).sum(), n, 3)
f = function([x, n], y)
out = f([[0.0, 1.0, 2.0]], 1)
print(json.dumps({'compiled': compiled, 'out': out.tolist()}))
'''


def _compile(seed):
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    env.pop('THEANO_FLAGS', None)
    res = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _folders(cache):
    return sorted(os.path.join(d, f) for d, subdirs, files in os.walk(str(cache))
                  for f in subdirs if f.startswith('tmp'))


def test_a_second_process_compiles_nothing():
    cache = os.environ['THEANOMPI_EXT_CACHE']       # tests/conftest.py sets it
    first = _compile(1)
    # softmax([0, 2, 4]) + 3 (alloc of the sum of x), by numpy
    import numpy as np
    e = np.exp(np.array([0.0, 2.0, 4.0]) - 4.0)
    np.testing.assert_allclose(first['out'], [list(e / e.sum() + 3.0)], rtol=1e-6)
    kept = _folders(cache)
    for seed in (2, 3):
        again = _compile(seed)
        assert again['compiled'] == [], 'compiled again under PYTHONHASHSEED=%d' % seed
        assert again['out'] == first['out']
        assert _folders(cache) == kept
