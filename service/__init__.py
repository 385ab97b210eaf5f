"""The audit service: FastAPI app (REST API + dashboard), SQLAlchemy store, runner, auth.

Import :func:`flaudit.service.app.create_app` to build the application.
"""
