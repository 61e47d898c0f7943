"""The repository's folders, for tests at any depth of ``tests/unit/``:
``ROOT`` (the checkout), ``TESTS`` and ``DATA`` (``tests/data``)."""

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
DATA = os.path.join(TESTS, 'data')
