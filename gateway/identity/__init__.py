"""Who the browser's user is: login backends, server-side sessions, the subject check."""
