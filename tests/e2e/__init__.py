"""End to end: the example MCP server, the official SDK client, a real browser and provider."""
