"""Minakova & Stefanov (2022): the memory-throughput trade-off of CNN-based applications.

* :class:`Application` - CNNs, partitions, parallel sets and schedules; memory cost
  ``M = M^par + M^buf`` (Eq. 1-4) for fp32/fp16; :func:`load_application` reads YAML.
* :func:`reuse_buffers` - Algorithm 1, buffer reuse across and within CNNs, never between
  partitions that run in parallel.
* :func:`cnn_from_module` / :func:`cnn_from_graph` - a CNN's layers are the operators of
  layerfit's capture (:mod:`layerfit.capture`, torch.fx), each with its kernels.
* :func:`plan_rows` / :class:`PartsExecutor` - processing by parts: minimum row buffers
  and the phase schedule of a partition, run in row stripes by the engine
  (:mod:`layerfit.engine.stripes`) with those buffers.
* :func:`reduce_buffers` - Algorithm 2, NSGA-II over "this layer processes by parts"
  under memory and throughput constraints.
* :class:`TwoStagePipeline` - a CNN split in two partitions on two threads with a
  double-buffered edge.
* :func:`cnn_from_engine` / :class:`EngineStage` - a loaded engine's model by parts, a
  stage (a range of its layers) run as a pass of the engine with only its units, under
  any policy that can hold a chain of units by parts at once.
"""

from layerfit.tradeoff.parts.appfile import Constraints, application_from_dict, load_application
from layerfit.tradeoff.parts.application import (
    AppEdge,
    Application,
    DerivedApplication,
    MemoryCost,
    Partition,
    split_partitions,
)
from layerfit.tradeoff.parts.cnn import CNN, Layer
from layerfit.tradeoff.parts.executor import (
    TOLERANCE,
    PartsExecutor,
    stage_of,
    untiled_peak_bytes,
)
from layerfit.tradeoff.parts.flow import FlowGraph, FlowNode, RowPlan, format_schedule, plan_rows
from layerfit.tradeoff.parts.kernels import cnn_from_graph, cnn_from_module
from layerfit.tradeoff.parts.on_engine import EngineStage, cnn_from_engine
from layerfit.tradeoff.parts.pipeline import PipelineReport, TwoStagePipeline, measure_pipeline
from layerfit.tradeoff.parts.reuse import SharedBuffer, naive_buffers, reuse_buffers
from layerfit.tradeoff.parts.rows import RowMap
from layerfit.tradeoff.parts.search import (
    Evaluation,
    GAParams,
    TradeoffResult,
    Violation,
    reduce_buffers,
)
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
    "AppEdge",
    "Application",
    "Constraints",
    "DerivedApplication",
    "EngineStage",
    "Evaluation",
    "FlowGraph",
    "FlowNode",
    "GAParams",
    "Layer",
    "MeasuredThroughput",
    "MemoryCost",
    "Partition",
    "PartsExecutor",
    "PipelineReport",
    "ProfiledThroughput",
    "RowMap",
    "RowPlan",
    "SharedBuffer",
    "TradeoffResult",
    "TwoStagePipeline",
    "Violation",
    "application_from_dict",
    "cnn_from_engine",
    "cnn_from_graph",
    "cnn_from_module",
    "estimator_for",
    "format_schedule",
    "load_application",
    "measure_pipeline",
    "naive_buffers",
    "plan_rows",
    "reduce_buffers",
    "reuse_buffers",
    "split_partitions",
    "stage_of",
    "untiled_peak_bytes",
]
