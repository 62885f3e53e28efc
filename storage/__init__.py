"""The durable side of kernelloop: the SQLModel tables, the queries the service and `kernelloop history`
share, and the job queue. SQLite by default, any SQLAlchemy URL. The public shapes of what it stores are
`kernelloop.contract`'s."""
