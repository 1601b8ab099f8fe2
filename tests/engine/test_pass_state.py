"""The pass's shared state is small and each field has one writer; each stage's own
state is written by that stage alone (the others call its methods)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import layerfit.engine
from layerfit.engine.expert_guess import Guessed, PassGuesses
from layerfit.engine.pass_state import PassState
from layerfit.engine.reader import ReadUnits
from layerfit.engine.ring import RingBuffer

ENGINE = Path(layerfit.engine.__file__).parent
MUTATORS = {"add", "update", "discard", "pop", "popitem", "clear", "append", "extend", "remove", "setdefault",
            "insert", "__setitem__", "__delitem__"}
# A stage's state, reached through the stream (or the stage itself), and the one module that writes it.
STAGE_OWNERS = {"reader": "reader.py", "output": "reader.py", "copier": "copier.py", "kernels": "kernels.py",
                "guesses_made": "expert_guess.py"}
CREATOR = "its creator"


def _fields() -> list[str]:
    """The attributes ``PassState.__init__`` sets, in order."""
    init = ast.parse(inspect.getsource(PassState)).body[0]
    init = next(n for n in init.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    names = []
    for node in ast.walk(init):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.append(t.attr)
    return list(dict.fromkeys(names))


def _chain(node: ast.expr) -> list[str]:
    """``stream.reader.output.ready[k]`` -> ["stream", "reader", "output", "ready"]."""
    names: list[str] = []
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            names.append(node.id)
            return names[::-1]
        else:
            return names[::-1]


def _written(tree: ast.AST) -> list[tuple[list[str], int]]:
    """Every attribute chain the module writes: assigned (also by item or augmented),
    deleted, or changed by a mutating method; with its line."""
    out = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in MUTATORS):
            targets = [node.func.value]
        flat: list[ast.expr] = []
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            else:
                flat.append(t)
        out.extend((_chain(t), node.lineno) for t in flat if isinstance(t, (ast.Attribute, ast.Subscript)))
    return out


def _engine_writes() -> dict[str, list[tuple[list[str], int]]]:
    return {path.name: _written(ast.parse(path.read_text())) for path in sorted(ENGINE.glob("*.py"))}


def _documented_writers() -> dict[str, str]:
    """Field -> writer, from the table in pass_state.py's docstring."""
    import layerfit.engine.pass_state as module

    writers = {}
    for line in module.__doc__.splitlines():
        match = re.match(r"^(\w+)\s{2,}.*?\s{2,}(its creator|the kernel stage|the stream)\b", line)
        if match:
            writers[match.group(1)] = match.group(2)
    return writers


WRITER_MODULES = {"the kernel stage": "kernels.py", "the stream": "stream.py"}


def test_the_shared_state_is_at_most_fifteen_fields_each_documented():
    fields = _fields()
    assert len(fields) <= 15, fields
    assert set(_documented_writers()) == set(fields)


def test_each_shared_field_has_one_writer_the_documented_one():
    """Writes to a pass's state (``run.<field>``, the name every stage gives it) outside
    its creation: each field from the one module its documentation names, or none at
    all for those its creator sets."""
    documented = _documented_writers()
    writers: dict[str, set[str]] = {f: set() for f in documented}
    for module, writes in _engine_writes().items():
        for chain, _ in writes:
            if len(chain) >= 2 and chain[-2] == "run" and chain[-1] in writers:
                writers[chain[-1]].add(module)
    for field, who in documented.items():
        expected = set() if who == CREATOR else {WRITER_MODULES[who]}
        assert writers[field] == expected, (field, writers[field])


def test_a_stages_state_is_written_by_that_stage_alone():
    """No module writes another stage's state through it (``stream.reader.output.ready[k] =
    None`` outside reader.py, say): it calls that stage's method instead."""
    wrong = []
    for module, writes in _engine_writes().items():
        for chain, line in writes:
            for part in chain[:-1]:
                owner = STAGE_OWNERS.get(part)
                if owner is not None and owner != module:
                    wrong.append(f"{module}:{line} writes {'.'.join(chain)}")
    assert not wrong, wrong


# --- the interfaces the stages call -------------------------------------------------------


def _read_units(sizes: list[int], ring: RingBuffer) -> ReadUnits:
    blocks = [SimpleNamespace(nbytes=n, name=f"u{i}", offset=sum(sizes[:i])) for i, n in enumerate(sizes)]
    stream = SimpleNamespace(ring=ring, blocks=blocks, trace=False, gathered={})
    return ReadUnits(stream, len(sizes), None)


def test_skipped_units_go_back_oldest_first_and_count_as_read_for_nothing():
    ring = RingBuffer(4096 * 8)
    read = _read_units([4096] * 6, ring)
    for k in (1, 2, 3):
        read.ready[k] = ring.allocate_locked(4096)
    read.give_back(range(1, 3))  # the kernels skipped units 1 and 2
    assert read.ready[1:4] == [None, None, 2 * 4096]
    assert read.read_for_nothing == 2 * 4096
    assert ring.in_use == 4096  # only unit 3's bytes are held
    assert not read.release_skipped(1)  # nothing left of it to give back
    assert read.release_skipped(3) and read.read_for_nothing == 3 * 4096 and ring.in_use == 0


def test_units_read_after_the_passs_last_count_as_read_for_nothing():
    ring = RingBuffer(4096 * 8)
    read = _read_units([4096, 8192, 4096], ring)
    read.ready[1] = ring.allocate_locked(8192)
    read.unrun(range(1, 3))
    assert read.read_for_nothing == 8192


def test_a_guess_is_readable_once_the_layer_it_is_held_for_read_its_experts():
    guesses = PassGuesses()
    held = Guessed(experts=(1, 2), ranks=(0, 0), tokens=1, top_k=2, hold=3)
    assert guesses.readable(5) is None
    guesses.made(5, held)
    assert guesses.readable(5) is None  # layer 3 first
    guesses.layer_read(3)
    assert guesses.readable(5) is held
    free = Guessed(experts=(0,), ranks=(0,), tokens=1, top_k=1, hold=None)
    guesses.made(7, free)
    assert guesses.readable(7) is free


def test_a_pass_a_unit_source_drives_has_begun():
    assert PassState(4, source=object()).begin == 0
    assert PassState(4).begin is None
