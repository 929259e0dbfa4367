"""Third-party OAuth connections: the connect page, the callback, refresh and revocation."""
