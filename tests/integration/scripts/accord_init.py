"""Worker that uses accord's own init (the runtime's bootstrap) through accordrun's store, sums
rank+1 over the store it met the others on and prints "RESULT <json>"."""
import json

from accord.runtime.bootstrap import bootstrap

rt = bootstrap()
topo = rt.topology
rt.store.set(f"value/{topo.rank}", str(topo.rank + 1))
rt.store.wait([f"value/{r}" for r in range(topo.size)])
total = sum(float(rt.store.get(f"value/{r}")) for r in range(topo.size))
print("RESULT " + json.dumps({"source": rt.source, "rank": topo.rank, "size": topo.size,
                              "local_rank": topo.local_rank, "sum": total}), flush=True)
rt.close()
