"""A converter's worker process: ``python -m stoker.convert._worker_main`` (see
:mod:`stoker.convert._workers`). A module of its own, which nothing imports, so that running
it with ``-m`` never finds it imported already."""

from ._workers import serve

if __name__ == "__main__":
    serve()
