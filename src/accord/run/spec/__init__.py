"""What a launch is, as pure data: hosts and slots, rank assignment, the address to advertise, flag
values, the tuning table, the workers' program and environment, and the server roles (no I/O)."""
