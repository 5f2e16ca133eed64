"""Worker that uses accord's own init (the runtime's bootstrap) through accordrun's store,
allreduces rank+1 and prints "RESULT <json>"."""
import json

import torch
import torch.distributed as dist

from accord.runtime.bootstrap import bootstrap

rt = bootstrap()
t = torch.tensor([float(rt.topology.rank + 1)])
dist.all_reduce(t)
topo = rt.topology
print("RESULT " + json.dumps({"source": rt.source, "rank": topo.rank, "size": topo.size,
                              "local_rank": topo.local_rank, "sum": t.item()}), flush=True)
rt.close()
