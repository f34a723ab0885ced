"""The OpenAI-compatible surface of LLM functions: the wire format (``protocol``)
and errors in OpenAI's shape (``errors``). The routes are thin over these."""
