"""The durable side of kernelloop: SQLModel tables, the API's schemas beside them, the queries the
service and `kernelloop history` share, and the job queue. SQLite by default, any SQLAlchemy URL."""
