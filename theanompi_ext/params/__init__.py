"""A model's parameters: tags (:mod:`.tags`), the flat layout (:mod:`.layout`),
the host-bound set (:mod:`.host`) and the device-resident one (:mod:`.device`).

The host names are re-exported here (``from theanompi_ext.params import
ParamSet, ParamLayout, tags_of``). :mod:`.device` imports the engine (Theano)
and is therefore imported only by name, never from here.
"""
from .host import ParamSet  # noqa: F401
from .layout import ParamLayout  # noqa: F401
from .tags import TAGS, tag, tags_of  # noqa: F401
