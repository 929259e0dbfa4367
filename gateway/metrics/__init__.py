"""Prometheus metrics of the gateway, read from the database at scrape time."""
