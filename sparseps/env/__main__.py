"""``python -m sparseps.env``: print docs/env.md, rendered from the registry."""

from .docs import render_markdown

print(render_markdown(), end="")
