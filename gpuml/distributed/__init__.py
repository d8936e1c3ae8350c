"""Everything that crosses a device or process boundary, behind one seam.

* :mod:`~gpuml.distributed.comm`: the few collectives (allreduce, broadcast,
  allgather) over NCCL or over threads of one process;
* :mod:`~gpuml.distributed.placement`: parts over devices balanced by cost, one
  host thread per device;
* :mod:`~gpuml.distributed.partition`: the partitioners over rows sharded across
  ranks (distributed Lloyd, k-means++, greedy fill).

Estimators call these; they never call NCCL themselves.
"""

from .comm import Communicator, CommunicatorAborted, NcclCommunicator, ThreadCommunicator
from .partition import partition_on_devices, partition_shard
from .placement import (
    DeviceGroup,
    balance,
    balance_local,
    cholesky_cost,
    run_on_devices,
    smo_cost,
)

__all__ = [
    "Communicator",
    "CommunicatorAborted",
    "DeviceGroup",
    "NcclCommunicator",
    "ThreadCommunicator",
    "balance",
    "balance_local",
    "cholesky_cost",
    "partition_on_devices",
    "partition_shard",
    "run_on_devices",
    "smo_cost",
]
