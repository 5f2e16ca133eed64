"""accord.store: the job's authenticated key-value store, without torch.

The launcher (:mod:`accord.run`) runs the server; workers (:mod:`accord.runtime`), parameter
servers and kvstore clients connect to it. Every frame carries an HMAC-SHA256 with the per-job
secret, checked before anything is decoded (:mod:`accord.store.wire`); no pickle.

- :mod:`accord.store.wire`: frames, MACs, nonces.
- :mod:`accord.store.server`: ``StoreServer``, which serves a ``KeyTable`` (:mod:`accord.store.table`: set, get,
  add, compare_set, wait, delete, num_keys) to authenticated connections.
- :mod:`accord.store.handshake`: bounded handshakes of connections that have not yet authenticated.
- :mod:`accord.store.opcodes`: the request and status codes client and server share.
- :mod:`accord.store.connection`: ``StoreConnection``, a blocking client.
- :mod:`accord.store.secret`: reading the job secret (hex or a 0600 file).
"""

# The modules other accord packages may import; the rest are this package's own
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES = ("connection", "sealed_objects", "secret", "server", "wire")
