"""Serving runs over HTTP: the runs loaded once, their programs compiled at start-up, and one
worker that translates the requests waiting together (`engine`); the FastAPI routes, the
OpenAPI page and the attention explorer's page (`app`, `static/`, every file local).

May import: shared, runtime, data, models, runs, decoding, compare.
"""
