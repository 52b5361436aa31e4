"""Files that are whole or absent, and that prove it.

* :mod:`.atomic`: atomic writes (bytes, JSON, figures, several files at once),
  free-space checks;
* :mod:`.stale`: temporaries left by writers that died;
* :mod:`.sealed`: HDF5 files sealed with a checksum, checked before reading;
* :mod:`.signals`: stop signals held while a file is written;
* :mod:`.isolated`: writers run in a forked child, so a crash is an error.

Nothing is re-exported: import the module you use
(``from theanompi_ext.files import atomic``).
"""
