"""Data-parallel training tools on torch.distributed, around the optimizers of gpuml.optim.

* :class:`DataAssignmentSampler`: a ``DistributedSampler`` with overlap: the disjoint,
  coarse, medium-coarse and fine-grained data assignment schemes of Håland & Birkeland,
  *Exploring data assignment schemes when training deep neural networks using data
  parallelism*, 2020 (§4.1).
* :class:`HouseholdAverager`, :class:`HouseholdLayout`: households and neighbourhoods,
  hierarchical local SGD by periodic model averaging, with household shards (same thesis,
  §4.2); a ``torch.distributed`` ``ModelAverager``, so it plugs into
  ``PostLocalSGDOptimizer``.
* :class:`ParameterServer`, :class:`DownpourWorker`, :func:`rpc_session`: Downpour SGD of
  DistBelief (Dean et al., *Large Scale Distributed Deep Networks*, 2012) on
  ``torch.distributed.rpc``, the server applying Adagrad.
* :class:`PeerFailureError`: what a worker gets when another one died or hung.

Importing :mod:`gpuml` does not import torch; importing :mod:`gpuml.training` does.
"""

from gpuml.errors import PeerFailureError
from gpuml.training.downpour import DownpourWorker, ParameterServer, rpc_session
from gpuml.training.households import HouseholdAverager, HouseholdLayout
from gpuml.training.sampler import SCHEMES, DataAssignmentSampler

__all__ = [
    "SCHEMES",
    "DataAssignmentSampler",
    "DownpourWorker",
    "HouseholdAverager",
    "HouseholdLayout",
    "ParameterServer",
    "PeerFailureError",
    "rpc_session",
]
