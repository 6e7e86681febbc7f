"""The OpenAI-compatible chat server: ``create_app(backend, template)`` gives the ASGI app.

It renders each request with the model's own chat template, constrains generation for
``tool_choice`` and ``response_format``, and decodes the answer in the template's own format. Run it
with ``chatcodec serve``, or with uvicorn::

    from chatcodec.backends import LlamaBackend
    from chatcodec.server import create_app

    backend = LlamaBackend()
    app = create_app(backend, backend.template)
"""

from .app import create_app as create_app

__all__ = ["create_app"]
