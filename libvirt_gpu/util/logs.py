"""Loggers that load ``logging`` when first used.

``logging`` and what it imports (``traceback``, ``threading``, ``string``,
``weakref``...) are a cost a CLI call that logs nothing need not pay.
``logs.getLogger(__name__)`` returns a stand-in that loads ``logging`` and
forwards to ``logging.getLogger(name)`` the first time it is used. The CLI's
``basicConfig`` is given to ``configure``, which applies it then (or at once
when ``logging`` is already loaded); ``load`` applies it now, for code about
to load libraries that log themselves (oslo.config, keystoneauth1).
"""

import sys

_pending = None


def load():
    """The ``logging`` module, with any pending configuration applied."""
    global _pending
    import logging
    if _pending is not None:
        kwargs, _pending = _pending, None
        logging.basicConfig(**kwargs)
    return logging


def configure(**kwargs):
    """``logging.basicConfig(**kwargs)`` (levels by name, e.g.
    ``level='WARNING'``), applied when ``logging`` is first needed."""
    global _pending
    _pending = kwargs
    if 'logging' in sys.modules:
        load()


class _Logger(object):
    """Stands for ``logging.getLogger(name)`` until it is used."""

    __slots__ = ('name', '_logger')

    def __init__(self, name):
        self.name = name
        self._logger = None

    def __getattr__(self, attr):
        logger = self._logger
        if logger is None:
            logger = self._logger = load().getLogger(self.name)
        return getattr(logger, attr)

    def __repr__(self):
        return '<logs._Logger %s>' % self.name


def getLogger(name: str) -> _Logger:  # noqa: N802 - logging's name
    return _Logger(name)
