"""``python -m chatcodec``: the same as the ``chatcodec`` command."""

from .cli import main

raise SystemExit(main())
