"""What each request did, and on demand what it said: kept in SQLite off the request path."""
