"""The elicitation lifecycle: state machine, API routes, and (later) portal pages."""
