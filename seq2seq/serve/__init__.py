"""Serving runs over HTTP: the runs loaded once, their programs compiled from start-up on (`runs`),
and one worker that translates the requests waiting together (`engine`); the FastAPI routes, the
OpenAPI page and the attention explorer's page (`app`, `static/`, every file local).

May import: shared, runtime, data, models, runs, decoding, compare.
"""

# The modules of the [serve] extra that `app` imports (pydantic and starlette come with
# fastapi): commands check them before they start (`errors.require_extra`).
EXTRA = ("fastapi", "uvicorn", "swagger_ui_bundle")
