"""Imports every feature's models, so metadata and migrations see all tables."""

from gateway.audit.models import AuditEvent
from gateway.clients.models import ApiToken, Client, WebhookSecret
from gateway.elicitations.models import Elicitation, IdempotencyRecord

__all__ = ["ApiToken", "AuditEvent", "Client", "Elicitation", "IdempotencyRecord",
           "WebhookSecret"]
