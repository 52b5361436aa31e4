"""kn, avg and cdd on 2, 3 and 4 real MPI ranks against hand-computed numbers.

Layout [W0, W1 | b | gamma]; the kn-normalised gradient of rank r is
BASE + r * DELTA (rank0 [0.1, 0.2, 0.3, 0.4], rank1 [0.3, 0.0, -0.1, 0.2],
rank2 [0.5, -0.2, -0.5, 0.0]); lr 0.1, momentum 0.9, weight decay 0.01;
two steps with the same gradients. The expected values are computed
element by element in plain Python from the rank and the world size.
"""
import json

import pytest

BASE, DELTA = [0.1, 0.2, 0.3, 0.4], [0.2, -0.2, -0.4, -0.2]
W0 = [1.0, 2.0, 0.5, 1.0]
LR, MU, WD = 0.1, 0.9, 0.01


def grads(k):
    """Every rank's gradient in a world of ``k`` ranks."""
    return {r: [b + r * d for b, d in zip(BASE, DELTA)] for r in range(k)}


def expected_kn(k=2):
    # exchanged entries 0..2 step with the sum; gamma (3) with k*g (its n-mean); no decay on gamma
    G = grads(k)
    out = {r: [] for r in G}
    for r in G:
        w, u = list(W0), [0.0] * 4
        for _ in range(2):
            for i in range(4):
                g = sum(G[q][i] for q in G) if i < 3 else k * G[r][i]
                g += WD * w[i] if i < 3 else 0.0
                u[i] = MU * u[i] + g
                w[i] -= LR * u[i]
            out[r].append(list(w))
    return out


def expected_avg(k=2):
    G = grads(k)
    w = {r: list(W0) for r in G}
    u = {r: [0.0] * 4 for r in G}
    out = {r: [] for r in G}
    for _ in range(2):
        for r in G:
            for i in range(4):
                g = k * G[r][i] + (WD * w[r][i] if i < 3 else 0.0)
                u[r][i] = MU * u[r][i] + g
                w[r][i] -= LR * u[r][i]
        for i in range(3):  # parameters (not gamma) averaged
            m = sum(w[r][i] for r in G) / k
            for r in G:
                w[r][i] = m
        for r in G:
            out[r].append(list(w[r]))
    return out


def expected_cdd(k=2):
    G = grads(k)
    w = {r: list(W0) for r in G}
    u = {r: [0.0] * 4 for r in G}
    out = {r: [] for r in G}
    for _ in range(2):
        for r in G:
            for i in range(4):
                u[r][i] = MU * u[r][i] + k * G[r][i] + (WD * w[r][i] if i < 2 else 0.0)
        for r in G:
            for i in range(4):
                mult = 2.0 if i == 2 else 1.0      # biases at 2x lr
                step = sum(u[q][i] for q in G) / k if i < 3 else u[r][i]
                w[r][i] -= LR * mult * step
            out[r].append(list(w[r]))
    return out


def run_rule(mpirun, sync_type, k):
    G = grads(k)
    res = mpirun(k, 'run_rules.py', sync_type, json.dumps([G[r] for r in range(k)]),
                 timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(data) == k
    return {r: data[r] for r in range(k)}


@pytest.mark.parametrize('k', [2, 3, 4])
@pytest.mark.parametrize('sync_type,expected', [('kn', expected_kn), ('avg', expected_avg),
                                                ('cdd', expected_cdd)])
def test_rule_matches_hand_computation(mpirun, sync_type, expected, k):
    got, want = run_rule(mpirun, sync_type, k), expected(k)
    for r in range(k):
        for step in range(2):
            assert got[r][step] == pytest.approx(want[r][step], rel=1e-5, abs=1e-6), (r, step)
    # exchanged parameters agree on every rank; gamma stays each rank's own
    for r in range(1, k):
        assert got[r][1][:3] == got[0][1][:3]
        assert got[r][1][3] != got[0][1][3]


def test_rank_gradients_are_the_documented_ones():
    G = grads(3)
    assert G[0] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert G[1] == pytest.approx([0.3, 0.0, -0.1, 0.2])
    assert G[2] == pytest.approx([0.5, -0.2, -0.5, 0.0])


def test_avg_equals_kn_at_equal_lr_but_cdd_does_not():
    """A finding worth keeping: averaging parameters after local *linear*
    momentum steps on n-normalised gradients is exactly kn-sum SGD at the
    same learning rate (the mean of the local momenta is the global one).
    What made Theano-MPI's runs differ is the rate (no linear scaling, a
    geometric per-epoch warm-up) and, for cdd, the bias treatment."""
    kn, avg, cdd = expected_kn(), expected_avg(), expected_cdd()
    assert max(abs(a - b) for a, b in zip(kn[0][1][:3], avg[0][1][:3])) < 1e-12
    assert abs(kn[0][1][2] - cdd[0][1][2]) > 1e-3      # bias: 2x rate, no decay
    assert abs(kn[0][1][0] - cdd[0][1][0]) < 1e-12     # weights: same as kn


def test_old_schedule_differs_from_linear_scaling_rule():
    from theanompi_ext.update.schedule import Schedule
    new = Schedule(0.1, 8 * 32, 100, 90, ref_batch=32, warmup='gradual', workers=8)
    old = Schedule(0.1, 8 * 32, 100, 90, ref_batch=32, warmup='theanompi', workers=8)
    assert new.lr(150) != pytest.approx(old.lr(150))
    assert new.lr(1000) == pytest.approx(0.8) and old.lr(1000) == pytest.approx(0.8)
