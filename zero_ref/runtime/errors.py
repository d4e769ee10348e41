"""Errors the layers below the command line raise, shared by every layer."""


class CollectiveError(RuntimeError):
    """An error every rank raises at the same point, having decided it together
    (a schedule mismatch, a NaN gradient, a failed oracle check): the failure guard
    (zero_ref/app/failure.py) then prints it once and exits every rank cleanly."""
