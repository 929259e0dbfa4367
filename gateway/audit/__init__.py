"""Security events: who did what to which target, from where, with what outcome."""
