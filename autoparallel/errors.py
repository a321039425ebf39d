"""Errors a user can cause and fix.

The CLI turns every ``UserError`` into one line on stderr and exit code 2, never a traceback.
Anything else that escapes is a bug in autoparallel and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: an unknown name, a malformed file, a request no layout can satisfy."""


class SpecError(UserError):
    """A YAML spec with an unknown key, a missing key or a value of the wrong type."""


class UnpricedModelError(UserError, ValueError):
    """A model the asked-for cost model does not price (a hybrid Mamba-Transformer in serving):
    refused rather than priced wrongly; a ValueError to the library's callers."""
