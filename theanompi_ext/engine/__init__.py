"""The engine (Theano) and the devices it runs on.

* :mod:`.core`: the only module that imports Theano, configured on import;
* :mod:`.flags`: Theano's flags, computed without importing Theano;
* :mod:`.devices`: device strings and lists, and which device a rank takes
  (no Theano: the device is chosen before Theano loads);
* :mod:`.open`: opens rank r's device and loads the engine, agreeing with every rank.

This file imports nothing, so that ``theanompi_ext.engine.devices`` and
``.flags`` can be imported without loading Theano.
"""
