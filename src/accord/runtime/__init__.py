"""accord.runtime: how a worker joins its job: who started it, the job's store, the topology and its
rank groups, c10d bootstrapped through accord's store, and admission to a running elastic job.
"""
