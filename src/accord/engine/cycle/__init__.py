"""The threaded cycle of one process set: the controller and its thread, the state its parts share,
the names in flight, gathering, negotiated and planned cycles, callers that run a cycle themselves,
execution and fusion, the stall inspector, the timeline, join's side of the controller, and failures."""
