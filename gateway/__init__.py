"""The gateway: a secure entry portal for MCP URL-mode elicitations."""

__version__ = "0.1.0"
