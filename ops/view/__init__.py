"""The scheduler view: a cached, followed copy of CRR_SNAPSHOT that answers `select[]`."""
