"""Measurements: ``theanompi-ext bench <name>`` (see :mod:`.cli`).

``overlap``  serial vs backprop-overlapped gradient exchange (:mod:`.overlap`).
"""
