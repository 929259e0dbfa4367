"""The Python client of the gateway, for MCP servers."""

from gateway.client.webhooks import WebhookVerificationError, verify_webhook

__all__ = ["WebhookVerificationError", "verify_webhook"]
