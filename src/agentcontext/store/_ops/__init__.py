"""The concern modules of the store: plain functions of a SQLAlchemy ``Connection``, one module
per concern (chats, messages, chains, branches, appends, checkpoints, snapshots, search, the
graph, pages, retention, transfer, copies), each run as a unit of work by the database object
(``store._db``), and the async policies built on such units (a retry, a choice of write path).
The facade (``store.sql``) calls one of them per method."""
