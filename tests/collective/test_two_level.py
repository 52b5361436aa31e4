"""The two-level allreduce on ranks of one machine faked as hosts (no root needed).

THEANOMPI_EXT_FAKE_RANKS_PER_HOST=2 makes ranks 0-1 one host and 2-3 the next
(collective/two_level.py). Tolerances are in tests/mpi/run_two_level.py: the
float32 sum of k values in any order errs by at most (k-1) 2**-24 sum|x|
(one rounding per addition), so two-level and flat may differ by twice that.
"""
import pytest

from theanompi_ext.collective.two_level import check_topology, two_level_pays
from theanompi_ext.collective.two_level import FAKE_HOSTS_VAR


@pytest.mark.parametrize('k,expect', [
    (4, {'per_host': [2, 2], 'auto': 'two-level rsag', 'algorithms': ['leader', 'rsag']}),
    (3, {'per_host': [2, 1], 'auto': 'two-level leader', 'algorithms': ['leader']})])
def test_two_level_sums_match_float64_and_flat_on_faked_hosts(mpirun, k, expect):
    import json
    res = mpirun(k, 'run_two_level.py', timeout=120, env={FAKE_HOSTS_VAR: '2'})
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out['per_host'] == expect['per_host'] and out['auto'] == expect['auto']
    assert sorted(out['algorithms']) == expect['algorithms']
    for worst in out['algorithms'].values():
        assert sorted(worst) == ['bfloat16', 'float16', 'float32', 'vs flat']
        assert all(v <= 1 for v in worst.values())
        # the 16-bit wire really crossed the faked host boundary: its error shows
        assert worst['float16'] > 0.01 and worst['bfloat16'] > 0.01
    assert out['overflow'] is True


def test_auto_chooses_two_levels_only_where_they_can_help():
    assert two_level_pays((2, 2)) and two_level_pays((2, 1))
    assert not two_level_pays((4,)) and not two_level_pays((1, 1, 1))
    assert check_topology('auto') == 'auto'
    with pytest.raises(ValueError, match='unknown topology .ring.; choose from flat, '
                                         'two-level, auto'):
        check_topology('ring')


def test_the_registry_passes_the_topology_to_mpi_only():
    from theanompi_ext.collective.registry import create_communicator
    from theanompi_ext.errors import BackendRefused
    create_communicator('local', topology='two-level').close()   # one rank: nothing to span
    with pytest.raises(BackendRefused, match="topology 'two-level' needs the mpi backend, "
                                             "not 'nccl'"):
        create_communicator('nccl', topology='two-level')
    with pytest.raises(ValueError, match='unknown topology'):
        create_communicator('local', topology='ring')
