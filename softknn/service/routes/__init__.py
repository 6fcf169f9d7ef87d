"""Thin route modules: unpack the request, call the runtime/core, shape the response."""
