"""Tiny record sets with exact expected plans, ported from TFLite GPU's tests.

``memory_management_test.cc`` and ``memory_management/internal_test.cc`` give each
fixture as ``{size, first_task, last_task}`` and expect per-tensor object ids / offsets;
tensor ``i`` here has id ``i``. Sizes are exact (alignment 1), as in TFLite.
"""

from __future__ import annotations

from layerfit.memory import TensorUsageRecord, make_records


def _records(rows: list[tuple[int, int, int]]) -> list[TensorUsageRecord]:
    return make_records(
        [(i, first, last, size) for i, (size, first, last) in enumerate(rows)], alignment=1
    )


ONE = _records([(16, 0, 1)])

CHAIN = _records([(16, 0, 1), (8, 1, 2), (64, 2, 3), (32, 3, 4), (8, 4, 5)])

COMPLEX = _records(
    [
        (32, 0, 1),
        (32, 1, 4),
        (8, 2, 5),
        (16, 3, 5),
        (8, 4, 5),
        (64, 5, 7),
        (8, 6, 8),
        (8, 7, 8),
        (16, 8, 9),
    ]
)

# (object ids per tensor, object sizes), from memory_management_test.cc
TFLITE_OBJECTS = {
    "CHAIN": {
        "naive": ([0, 1, 2, 3, 4], [16, 8, 64, 32, 8]),
        "greedy_in_order": ([0, 1, 0, 1, 0], [64, 32]),
        "min_cost_flow": ([0, 1, 0, 1, 0], [64, 32]),
        "greedy_by_breadth": ([0, 1, 0, 1, 0], [64, 32]),
        "greedy_by_size_improved": ([0, 1, 0, 1, 0], [64, 32]),  # TFLite GREEDY_BY_SIZE
    },
    "COMPLEX": {
        "naive": ([0, 1, 2, 3, 4, 5, 6, 7, 8], [32, 32, 8, 16, 8, 64, 8, 8, 16]),
        "greedy_in_order": ([0, 1, 0, 2, 3, 1, 3, 2, 0], [32, 64, 16, 8]),
        "min_cost_flow": ([0, 1, 2, 0, 3, 1, 3, 2, 0], [32, 64, 8, 8]),
        "greedy_by_breadth": ([0, 4, 2, 1, 3, 0, 2, 3, 1], [64, 16, 8, 8, 32]),
        "greedy_by_size_improved": ([1, 0, 2, 1, 3, 0, 1, 2, 0], [64, 32, 8, 8]),
    },
}

# (offsets per tensor, arena size); greedy_by_size is TFLite's AssignOffsetsToTensors
TFLITE_OFFSETS = {
    "ONE": {"greedy_by_size": ([0], 16)},
    "CHAIN": {"greedy_by_size": ([0, 64, 0, 64, 0], 96)},
    "COMPLEX": {"greedy_by_size": ([0, 32, 80, 64, 88, 0, 64, 72, 0], 96)},
}

# CalculateTaskProfiles (record indices per operator, largest first) and positional maxima
TFLITE_PROFILES = {
    "ONE": ([[0], [0]], [16]),
    "CHAIN": ([[0], [0, 1], [2, 1], [2, 3], [3, 4], [4]], [64, 32]),
    "COMPLEX": (
        [
            [0],
            [0, 1],
            [1, 2],
            [1, 3, 2],
            [1, 3, 2, 4],
            [5, 3, 2, 4],
            [5, 6],
            [5, 6, 7],
            [8, 6, 7],
            [8],
        ],
        [64, 32, 8, 8],
    ),
}

# ObjectsToOffsets: (object sizes, object ids) -> offsets
TFLITE_OBJECTS_TO_OFFSETS = [
    ((), [], [], 0),
    ((16,), [0], [0], 16),
    ((16,), [0, 0, 0], [0, 0, 0], 16),
    ((16, 8, 32, 32, 4, 16), [2, 0, 2, 1, 3, 3, 1, 5], [24, 0, 24, 16, 56, 56, 16, 92], 108),
]

FIXTURES = {"ONE": ONE, "CHAIN": CHAIN, "COMPLEX": COMPLEX}
