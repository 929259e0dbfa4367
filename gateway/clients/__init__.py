"""MCP servers registered with the gateway: their API tokens and webhook endpoints."""
