"""Starting, watching and stopping processes: the supervisor, runners (local, ssh), the guardian,
the exit-release runner, output and rank files, failures and the root-cause box, the job's
store, and the folder copy to other hosts."""
