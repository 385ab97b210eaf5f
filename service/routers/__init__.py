"""API routers grouped by resource: audits, ingest (used by the ServerApp), health."""
