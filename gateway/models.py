"""Imports every feature's models, so metadata and migrations see all tables."""

from gateway.audit.models import AuditEvent

__all__ = ["AuditEvent"]
