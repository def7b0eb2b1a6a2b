"""Families of alternative implementations, one module each: a family finds its sites in the
joint graph, measures its options there, describes them to the solver and rewrites the graph."""

from .activations import GeluCodes, SiluCodes
from .base import RERUN, Measured, Site
from .batch_norm import BatchNormFromOutput, BatchNormRerun
from .conv import ConvAlgorithm
from .dropout import DropoutMask
from .pool import PoolOffsets
from .relu import ReluInPlace, ReluMask

__all__ = ["RERUN", "BatchNormFromOutput", "BatchNormRerun", "ConvAlgorithm", "DropoutMask", "GeluCodes", "Measured",
           "PoolOffsets", "ReluInPlace", "ReluMask", "SiluCodes", "Site"]
