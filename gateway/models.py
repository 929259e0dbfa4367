"""Imports every feature's models, so metadata and migrations see all tables."""

from gateway.audit.models import AuditEvent
from gateway.clients.models import ApiToken, Client, WebhookSecret
from gateway.credentials.models import Credential
from gateway.elicitations.models import Elicitation, IdempotencyRecord
from gateway.identity.models import BrowserSession, User
from gateway.oauth.models import OAuthState
from gateway.payments.models import Payment, StripeEvent
from gateway.vault.models import KeyVersion, VaultInstance
from gateway.webhooks.models import WebhookAttempt, WebhookEvent, WorkerHeartbeat

__all__ = ["ApiToken", "AuditEvent", "BrowserSession", "Client", "Credential", "Elicitation",
           "IdempotencyRecord", "KeyVersion", "OAuthState", "Payment", "StripeEvent", "User",
           "VaultInstance", "WebhookAttempt", "WebhookEvent", "WebhookSecret", "WorkerHeartbeat"]
