"""Serving the app: TLS material and gunicorn."""
