"""Database adapter: SQLAlchemy models, engine set-up, migrations, repositories."""
