"""The base of every error monet raises on purpose: `except monet.MonetError` catches them all."""


class MonetError(Exception):
    """An error monet raised on purpose, with a message that says what to do."""
