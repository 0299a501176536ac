"""A stand-in for the ``six`` package, which PaddleRec's readers import and sparseps does
not install (Python 2 is long gone). Of it they use ``six.PY2`` alone (``common_ps.py``
reads the config file one way under Python 2, another under 3). The reader tests put this
folder first on ``PYTHONPATH``, under Paddle and under sparseps alike."""

PY2 = False
PY3 = True
