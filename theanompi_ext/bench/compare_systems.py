"""What ``bench compare`` compares: the systems, their timed modes, the models.

Our systems are named ``theanompi_ext/<exch_strategy>`` plus a suffix per
16-bit wire (:data:`WIRE_SUFFIX`); DDP's ``pytorch/ddp-gloo`` plus its
bucket cap and hook (:func:`ddp_system`). :data:`MODEL_SPECS` are the
architectures both projects build (ours in :mod:`.compare_rank`, PyTorch
in :mod:`.ddp_worker`).
"""

SYSTEMS = ('theanompi_ext/ar-overlap', 'theanompi_ext/ar', 'pytorch/ddp-gloo')
# Our modes without an exchange (shared by every wire), and those with one
# (named mode + WIRE_SUFFIX[wire], one set per --wire-dtype).
COMPUTE_MODES = ('compute', 'compute_chunked')
EXCHANGE_MODES = ('serial', 'overlap', 'allreduce')
OURS_MODES = COMPUTE_MODES + EXCHANGE_MODES
WIRE_SUFFIX = {'float32': '', 'float16': '-fp16', 'bfloat16': '-bf16'}
# DDP communication hooks measured by --ddp-fp16-hook: name -> the wire it sends.
DDP_HOOK_WIRE = {'none': 'float32', 'fp16': 'float16'}
# The architectures both sides build: ours with model.resnet.cifar_resnet
# (the same call as the zoo's resnet20 / resnet20_wide) or the zoo's
# digits_cnn, PyTorch with ddp_worker.build_model.
MODEL_SPECS = {
    'resnet20': dict(kind='cifar_resnet', depth=20, width=16, input_shape=[3, 32, 32]),
    'resnet20_wide': dict(kind='cifar_resnet', depth=20, width=64, input_shape=[3, 32, 32]),
    # --quick: the test suite's model; a ResNet compiles 3x longer in Theano.
    'digits_cnn': dict(kind='digits_cnn', width=16, input_shape=[1, 8, 8]),
}


def ours_modes(wires):
    """Our timed modes for the wire dtypes ``wires``: the shared compute modes,
    then :data:`EXCHANGE_MODES` suffixed per wire (float32: no suffix)."""
    return COMPUTE_MODES + tuple(m + WIRE_SUFFIX[w] for w in wires for m in EXCHANGE_MODES)


def ddp_system(cap_mb, hook='none'):
    """The system name of DDP with ``bucket_cap_mb=cap_mb`` (25, its default: plain),
    suffixed ``-fp16`` with the fp16 compression hook."""
    name = SYSTEMS[2] if cap_mb == 25 else '%s-%gmb' % (SYSTEMS[2], cap_mb)
    return name + ('-fp16' if hook == 'fp16' else '')


__all__ = ['COMPUTE_MODES', 'DDP_HOOK_WIRE', 'EXCHANGE_MODES', 'MODEL_SPECS', 'OURS_MODES',
           'SYSTEMS', 'WIRE_SUFFIX', 'ddp_system', 'ours_modes']
