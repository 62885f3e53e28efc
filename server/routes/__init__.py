"""The HTTP endpoints, one module per area; each route parses, calls the service or storage, answers."""
