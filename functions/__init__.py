"""Lambda entry points only: thin adapters from an event to one domain call."""
