"""A minimal stand-in for Theano-MPI (tests only): just the documented call pattern."""
