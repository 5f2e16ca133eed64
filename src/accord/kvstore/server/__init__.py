"""The parameter server: the program (``python -m accord.kvstore.server``), its ZeroMQ socket
(admission, MACs, replays), the core (key shards, aggregation, optimizers), what it keeps per
key, process-wide resource tuning and 2-bit decoding."""
