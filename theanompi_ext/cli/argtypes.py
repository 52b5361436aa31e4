"""argparse types shared by the command-line tools."""
import argparse
import os


def output_path(text):
    """argparse type of an output file or prefix: its folder must exist.

    Checked when the options are parsed, so that a typo in a folder name
    stops the command at once instead of after minutes of measuring.
    """
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError('folder %r does not exist (for %r)' % (folder, text))
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError('folder %r is not writable (for %r)' % (folder, text))
    return text


def positive_seconds(text):
    """argparse type of a duration in seconds: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%r is not a number of seconds' % (text,))
    if not value > 0:
        raise argparse.ArgumentTypeError('%r: must be more than 0 seconds' % (text,))
    return value
