"""The HTTP API (`contextlog api`): routes, keys, limits and the OpenAPI contract."""
