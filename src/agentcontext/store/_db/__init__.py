"""The database layer of the store: the one engine and its units of work (``database``), the
caller's transactions (``transactions``), read replicas, the store's options and how they make
the engine (``options``), the schema (``schema``) and its migrations (``migrate``), and the
compiled-SQL cache (``compiled``)."""
