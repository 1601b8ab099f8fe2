"""Minakova & Stefanov (2022): the memory-throughput trade-off of CNN-based applications.

* :class:`Application` - CNNs, partitions, parallel sets and schedules; memory cost
  ``M = M^par + M^buf`` (Eq. 1-4); :func:`load_application` reads its YAML file.
* :func:`reuse_buffers` - Algorithm 1, buffer reuse across and within CNNs.
* :func:`cnn_from_module` / :func:`cnn_from_graph` / :func:`cnn_from_engine` - a CNN's
  layers are the operators of layerfit's capture, each with the engine's kernels.
* :func:`plan_rows` / :class:`PartsExecutor` - processing by parts: minimum row buffers
  and the phase schedule of a partition, run in row stripes by the engine
  (:mod:`layerfit.engine.stripes`), as a pass of a loaded engine when given one.
* :func:`reduce_buffers` - Algorithm 2, NSGA-II over "this layer processes by parts"
  under memory and throughput constraints, throughput from an estimator.
* :class:`TwoStagePipeline` - a CNN split in two stages on two threads.
"""

from layerfit.tradeoff.parts.appfile import Constraints, load_application
from layerfit.tradeoff.parts.application import Application, Partition, split_partitions
from layerfit.tradeoff.parts.cnn import CNN, Layer
from layerfit.tradeoff.parts.executor import TOLERANCE, PartsExecutor, stage_of, untiled_peak_bytes
from layerfit.tradeoff.parts.flow import plan_rows
from layerfit.tradeoff.parts.kernels import cnn_from_engine, cnn_from_graph, cnn_from_module
from layerfit.tradeoff.parts.pipeline import TwoStagePipeline
from layerfit.tradeoff.parts.reuse import reuse_buffers
from layerfit.tradeoff.parts.search import GAParams, TradeoffResult, reduce_buffers
from layerfit.tradeoff.parts.throughput import (
    AnalyticThroughput,
    MeasuredThroughput,
    ProfiledThroughput,
    estimator_for,
)

__all__ = [
    "CNN",
    "TOLERANCE",
    "AnalyticThroughput",
    "Application",
    "Constraints",
    "GAParams",
    "Layer",
    "MeasuredThroughput",
    "Partition",
    "PartsExecutor",
    "ProfiledThroughput",
    "TradeoffResult",
    "TwoStagePipeline",
    "cnn_from_engine",
    "cnn_from_graph",
    "cnn_from_module",
    "estimator_for",
    "load_application",
    "plan_rows",
    "reduce_buffers",
    "reuse_buffers",
    "split_partitions",
    "stage_of",
    "untiled_peak_bytes",
]
