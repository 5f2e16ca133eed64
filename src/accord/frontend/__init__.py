"""The framework-neutral half of every frontend (Horovod keeps it in ``horovod/common``): what
``accord.torch`` and ``accord.mxnet`` share above the engine."""
