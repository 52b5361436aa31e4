"""Model files written the way Theano-MPI's own models are (tests only).

The package imports Theano at its top, as a user's model package may: the
launching side and the ranks must configure the engine before importing it.
"""
import theano  # noqa: F401
