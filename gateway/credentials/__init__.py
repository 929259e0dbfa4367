"""Credentials users hand over: the type catalog, capture, retrieval."""
