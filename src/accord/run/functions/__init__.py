"""Running Python functions as a job: ``accord.spawn`` and Horovod's ``horovod.run``
(``accord.run``), with the function sent by reference or by value."""
