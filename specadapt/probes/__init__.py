"""Everything that talks to a running server through its HTTP API."""
