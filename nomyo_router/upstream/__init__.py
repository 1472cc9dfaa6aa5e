"""Everything that talks to backends: the shared HTTP session, discovery and health, translation."""
