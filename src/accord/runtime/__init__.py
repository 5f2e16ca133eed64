"""accord.runtime: how a worker joins its job: who started it, the job's store, the topology and its
rank groups, c10d bootstrapped through accord's store, and admission to a running elastic job.
"""

# The modules other accord packages may import; the rest are this package's own
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES = ("admission", "bootstrap", "environments", "groups", "rendezvous", "settings", "topology")
