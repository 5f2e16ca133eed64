"""The negotiation, pure: which named requests are ready on every rank, what becomes an error on
every rank, grouped calls all or none, refused arguments, and join's stand-ins. No threads and
no communicators: everything here is a function of the exchanged data."""
