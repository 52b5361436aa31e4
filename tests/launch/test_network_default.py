"""The rule that picks the interface and transport (launch/network_default.py), the
route lookup it rests on (launch/host_routes.py), the mpiexec words of each choice,
and what info says (launch/network_choice.py). No MPI, no root."""
import subprocess

import pytest

from theanompi_ext.launch import host_routes
from theanompi_ext.launch.host_routes import Route, parse_route, route_to
from theanompi_ext.launch.network_default import (choose_interface, choose_transport,
                                                  network_args)

HERE = Route('vm', None, 'lo', True, None)
IB = Route('node1', '10.1.0.2', 'ib0', False, None)
ETH = Route('node2', '192.168.0.3', 'eth1', False, None)
NOWHERE = Route('tmxh1', None, None, False, 'tmxh1 does not resolve here')

# (environment, routes of the hostfile's hosts) -> (value, source, words in why)
INTERFACE_CASES = [
    ({}, [], (None, 'this host', 'no hostfile')),
    ({}, [HERE, HERE], (None, 'this host', 'names only it')),
    ({}, [HERE, IB, ETH], ('ib0', 'route', 'reaches node1 (10.1.0.2)')),
    ({}, [ETH, IB], ('eth1', 'route', 'reaches node2')),            # the first other host
    ({}, [HERE, NOWHERE], (None, None, "MPI library's choice: tmxh1 does not resolve")),
    ({'THEANOMPI_EXT_IFACE': 'eth9'}, [HERE, IB], ('eth9', 'THEANOMPI_EXT_IFACE', '--iface')),
    ({'HYDRA_IFACE': 'eth9', 'OMPI_MCA_btl_tcp_if_include': 'x'}, [HERE, IB],
     ('eth9', 'HYDRA_IFACE', "hydra's own")),
    ({'OMPI_MCA_btl_tcp_if_include': 'eth9'}, [IB], ('eth9', 'OMPI_MCA_btl_tcp_if_include', '')),
    ({'THEANOMPI_EXT_IFACE': ''}, [HERE, IB], ('ib0', 'route', '')),  # empty is unset
]


@pytest.mark.parametrize('env,routes,want', INTERFACE_CASES)
def test_interface_rule(env, routes, want):
    c = choose_interface(env, routes)
    assert (c.value, c.source) == want[:2] and want[2] in c.why, c


# (environment, Open MPI?) -> (value, words in why, mpiexec arguments with interface eth1)
TRANSPORT_CASES = [
    ({}, False, (None, "MPICH's default", ['-iface', 'eth1'])),
    ({}, True, (None, "Open MPI's default", ['--mca', 'btl_tcp_if_include', 'eth1',
                                             '--mca', 'oob_tcp_if_include', 'eth1'])),
    ({'THEANOMPI_EXT_TRANSPORT': 'default'}, False, (None, "MPICH's default", ['-iface', 'eth1'])),
    ({'THEANOMPI_EXT_TRANSPORT': 'tcp'}, False, (
        'tcp', 'FI_PROVIDER=tcp', ['-iface', 'eth1', '-genv', 'MPIR_CVAR_CH4_NETMOD', 'ofi',
                                   '-genv', 'FI_PROVIDER', 'tcp', '-genv', 'FI_TCP_IFACE', 'eth1'])),
    ({'THEANOMPI_EXT_TRANSPORT': 'tcp'}, True, (
        'tcp', 'pml=ob1', ['--mca', 'btl_tcp_if_include', 'eth1', '--mca', 'oob_tcp_if_include',
                           'eth1', '--mca', 'pml', 'ob1', '--mca', 'btl', 'tcp,self,vader'])),
    # the user's own variables win over --transport: nothing added
    ({'THEANOMPI_EXT_TRANSPORT': 'tcp', 'FI_PROVIDER': 'verbs'}, False, (
        None, 'set by the environment: FI_PROVIDER=verbs', ['-iface', 'eth1'])),
    ({'OMPI_MCA_pml': 'ucx'}, True, (None, 'OMPI_MCA_pml=ucx', [
        '--mca', 'btl_tcp_if_include', 'eth1', '--mca', 'oob_tcp_if_include', 'eth1'])),
]


@pytest.mark.parametrize('env,openmpi,want', TRANSPORT_CASES)
def test_transport_rule_and_mpiexec_words(env, openmpi, want):
    t = choose_transport(env, openmpi)
    assert t.value == want[0] and want[1] in t.why, t
    assert network_args(choose_interface({}, [HERE, ETH]), t, openmpi) == want[2]


def test_what_mpi_reads_itself_is_not_repeated_and_bad_transport_refused():
    hydra_env = choose_interface({'HYDRA_IFACE': 'eth9'}, [IB])
    assert network_args(hydra_env, choose_transport({}, False), False) == []
    assert network_args(choose_interface({}, []), choose_transport({}, False), False) == []
    with pytest.raises(ValueError, match='unknown transport'):
        choose_transport({'THEANOMPI_EXT_TRANSPORT': 'ib'}, False)


def _ip(stdout, rc=0):
    return lambda cmd, **kw: subprocess.CompletedProcess(cmd, rc, stdout, 'RTNETLINK: x')


def test_routes_from_ip_route_get(monkeypatch):
    assert parse_route('10.1.0.2 via 10.0.0.1 dev ib0 src 10.1.0.1 uid 0 \\    cache') == \
        ('ib0', False)
    assert parse_route('local 10.0.0.5 dev lo table local src 10.0.0.5') == ('lo', True)
    monkeypatch.setattr(host_routes, 'resolve', lambda h: '10.1.0.2')
    assert route_to('node1', _ip('10.1.0.2 dev ib0 src 10.1.0.1 uid 0')) == \
        Route('node1', '10.1.0.2', 'ib0', False, None)
    assert route_to('node1', _ip('local 10.1.0.2 dev lo table local')).local
    r = route_to('node1', _ip('', rc=2))
    assert r.device is None and r.why.startswith('no route to node1 (10.1.0.2): RTNETLINK')
    assert route_to('localhost').local
    monkeypatch.undo()
    # real lookups: a name that does not resolve, and this machine's own route
    assert route_to('tmx-nohost.invalid').why == 'tmx-nohost.invalid does not resolve here'


def test_info_lines(tmp_path):
    from theanompi_ext.launch.network_choice import network_rows, topology_row
    hostfile = tmp_path / 'h'
    hostfile.write_text('localhost:2\n')
    rows = dict(network_rows(None, str(hostfile), {'THEANOMPI_EXT_TRANSPORT': 'tcp'}))
    assert rows['interface'].startswith('none needed: every rank on this host (the hostfile')
    assert rows['transport'].startswith('tcp: TCP between hosts')
    assert rows['topology'] == 'auto picks flat: every rank on one host'
    hostfile.write_text('a.invalid slots=2\nb.invalid slots=2\n')
    rows = dict(network_rows(None, str(hostfile), {'THEANOMPI_EXT_IFACE': 'ib0'}))
    assert rows['interface'].startswith('ib0: set by THEANOMPI_EXT_IFACE')
    assert rows['topology'] == ('auto picks two-level: 2 hosts (a.invalid:2, b.invalid:2), and '
                                'a host with more than one rank')
    assert "the MPI library's choice: a.invalid does not resolve here" in \
        dict(network_rows(None, str(hostfile), {}))['interface']
    assert topology_row([('a', 1), ('b', 1)])[1].startswith('auto picks flat: 2 hosts')
