"""The parameter server: the program (``python -m accord.kvstore.server``), its network side
(listeners, admission of connections before they prove they hold the secret, MACs, replays), the
core (key shards, aggregation, optimizers), what it keeps per key, process-wide resource tuning
and 2-bit decoding."""
