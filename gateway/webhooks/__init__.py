"""Webhooks to MCP servers, and the one guarded HTTP client every outbound call uses."""
