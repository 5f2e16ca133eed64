"""One agent per node (``accordrun --nnodes/--node-rank/--rdzv-endpoint``, Kubernetes' ``PET_*``,
SLURM's ``srun``): the node's place, the meeting at the endpoint, and the agent that starts,
stops and restarts its workers."""
