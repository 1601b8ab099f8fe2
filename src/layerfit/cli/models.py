"""``layerfit prepare``, ``inspect``, ``verify`` and ``run``: one prepared model, from its
folder to its outputs (``generate`` and ``plot-trace`` have modules of their own)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from layerfit.cli.app import app, console, limit_label, parse_shape, print_json, print_warnings
from layerfit.cli.engine_options import ENGINE_OPTIONS, EngineOptions, engine_options
from layerfit.engine.openmp import COMPUTE_THREADS_HELP, kernels_on, set_compute_threads
from layerfit.errors import InputError, LayerfitError

if TYPE_CHECKING:
    from layerfit.store.manifest import Manifest


# --- store and engine (prepare, inspect, verify, run, plot-trace) ----------------------




def _example_kwargs(path: str | None, input_shape: str | None) -> dict[str, Any] | None:
    """The keyword arguments stored in ``--example`` (safetensors: tensors only, nothing
    unpickled); a clear error for a missing or malformed file, or with --input-shape."""
    if path is None:
        return None
    if input_shape is not None:
        raise InputError("--example gives the example input: leave out --input-shape")
    tensors = _read_safetensors(path, f"--example {path}", "")
    if not tensors:
        raise InputError(f"--example {path} holds no tensors: store the example call's keyword arguments in it")
    return tensors


@app.command()
def prepare(
    model: str = typer.Argument(
        ..., help="hf:FOLDER (a local Hugging Face model folder as published), gguf:FILE (a GGUF file, stored "
        "as its quantized blocks; needs layerfit[gguf]), a zoo name (see `layerfit zoo`) or package.module:factory",
    ),
    output: str = typer.Option(..., "-o", "--output", help="directory to create"),
    class_name: str = typer.Option(
        None, "--class", help="hf: the transformers class to build, e.g. BertForMaskedLM (default: the config's)"
    ),
    seq_len: int = typer.Option(None, "--seq-len", help="hf: tokens of the derived example input (default 32)"),
    dtype: str = typer.Option(
        None, "--dtype", help="hf: store the weights as float32, float16 or bfloat16 (default: as the checkpoint stores them)"
    ),
    fixed_shape: bool = typer.Option(
        False, "--fixed-shape",
        help="hf: skip measuring the passes at other batches and lengths (a pass each, about 12); requests "
        "must then have the prepared shape",
    ),
    input_shape: str = typer.Option(None, "--input-shape", help="e.g. 1,3,224,224 (default: the model's)"),
    input_dtype: str = typer.Option("float32", "--input-dtype"),
    checkpoint: str = typer.Option(None, "--checkpoint", help="weights from a .safetensors file"),
    seed: int = typer.Option(0, "--seed", help="seed of the zoo's initialisation and the example input"),
    example: str = typer.Option(
        None, "--example", help="a .safetensors file whose tensors are the example call's keyword arguments "
        "(a model of several inputs, such as input_features and decoder_input_ids), instead of --input-shape",
    ),
    follow_symlinks_out: bool = typer.Option(
        False, "--follow-symlinks-out",
        help="hf: read files of the folder that are links to places outside it (by default such a link is "
        "refused: the folder could make prepare copy any file this user can read)",
    ),
    force: bool = typer.Option(False, "--force", help="replace an existing directory"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Capture MODEL and pack its weights in execution order into a prepared directory."""
    from layerfit.console import progress_bar
    from layerfit.sizes import format_bytes
    from layerfit.store import prepare as do_prepare
    from layerfit.store.gguf_folder import is_gguf
    from layerfit.store.hf_folder import DEFAULT_SEQ_LEN, HFOptions, is_hf

    hf = None
    if is_hf(model) or is_gguf(model):
        hf = HFOptions(class_name=class_name, seq_len=DEFAULT_SEQ_LEN if seq_len is None else seq_len, dtype=dtype,
                       variable_shapes=not fixed_shape, follow_symlinks_out=follow_symlinks_out)
    elif class_name is not None or seq_len is not None or dtype is not None or fixed_shape or follow_symlinks_out:
        raise InputError(
            "--class, --seq-len, --dtype, --fixed-shape and --follow-symlinks-out are for a Hugging Face folder "
            "(hf:FOLDER) or a GGUF file (gguf:FILE)"
        )
    # a bar only where someone watches (stderr a terminal; piped or --json: nothing)
    with progress_bar(f"preparing {model}", transfer=True, disable=as_json) as bar:
        manifest = do_prepare(
            model, output, input_shape=parse_shape(input_shape), input_dtype=input_dtype,
            checkpoint=checkpoint, force=force, seed=seed, example=_example_kwargs(example, input_shape),
            progress=lambda done, total: bar.update(completed=done, total=total), hf=hf,
        )
    summary = {
        "directory": output,
        "model": manifest.model,
        "input_shape": list(manifest.input_shape),
        "units": len(manifest.units),
        "weights_bytes": manifest.total_bytes,
        "largest_unit_bytes": manifest.largest_unit_bytes,
        "resident_bytes": manifest.resident_bytes,
        "capture": manifest.graph.method,
    }
    if as_json:
        print_json(summary)
    else:
        console.print(
            f"prepared {model} -> {output}: {len(manifest.units)} units, "
            f"{format_bytes(manifest.total_bytes)} of weights, largest unit "
            f"{format_bytes(manifest.largest_unit_bytes)}, resident {format_bytes(manifest.resident_bytes)} "
            f"(capture: {manifest.graph.method})"
        )


def _partial_units(m: Manifest, indices: list[int]) -> str:
    """Which units a pass reads in part: embedding tables by the rows their ids look up,
    modules of experts by the experts their router chose."""
    from layerfit.engine.experts import experts_segment

    experts = [i for i in indices if experts_segment(m.units[i])]
    tables = [i for i in indices if i not in experts]
    parts = []
    if tables:
        parts.append(f"embedding tables by the rows they look up: units {', '.join(map(str, tables))}")
    if experts:
        parts.append(f"experts by the ones their router chooses: units {', '.join(map(str, experts))}")
    return "; ".join(parts)


# What each column of inspect's table of units means: printed under the table and in
# `inspect --help`, so that nobody has to read the code to know what "d" is.
UNITS_LEGEND = (
    ("#", "the unit's place in execution order (units are streamed one at a time)"),
    ("unit, type", "the module read as one unit, and its class"),
    ("bytes", "the unit's segment in the weights file (its tensors, padded to a multiple of 4096 bytes "
     "for direct I/O), in decimal units: 1 kB = 1000 bytes"),
    ("offset", "where the segment starts in the weights file, in bytes"),
    ("d", "the unit's number of weight tensors (SwapNet's parameter depth)"),
    ("MMACs", "millions of multiply-accumulates of the unit in one inference"),
    ("auto", "with --budget, what `run --pipeline auto` does with the unit: kept (resident for the whole "
     "run), read (into the buffer at each inference), rows (an embedding table: only the rows the "
     "input looks up are read), experts (only the experts the router chooses are read)"),
)


def _legend_epilog() -> str:
    # typer's help reflows an epilog's lines; a blank line between them keeps one a column
    return "Columns of the table of units:\n\n" + "\n\n".join(f"{c}: {m}" for c, m in UNITS_LEGEND)


@app.command(epilog=_legend_epilog())
def inspect(
    directory: str = typer.Argument(..., help="prepared model directory"),
    budget: str = typer.Option(
        None, "--budget", help="also show how `run --pipeline auto` spends this weight budget, e.g. 24MB or 50% (units kept, bytes read)"
    ),
    stages: int = typer.Option(2, "--stages", help="with --budget: 2 (cpu) or 3 (a copy stage, as on cuda)"),
    memory_limit: str = typer.Option(
        None, "--memory-limit", help="load the model within this process memory, e.g. 800MB, and show the footprint "
        "measured beside the weights and how `run --pipeline auto` spends what it leaves (with --budget: at most that)",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show a prepared model: units with sizes and offsets, resident tensors, totals."""
    from layerfit.console import table
    from layerfit.engine.gather import gathered_units, streamed_minimum
    from layerfit.sizes import format_bytes
    from layerfit.store import read_manifest

    m = read_manifest(directory)
    footprint = None if memory_limit is None else _measured_footprint(directory, memory_limit, budget)
    if footprint is not None and budget is None:  # a budget given was checked against the limit by the load
        budget = str(footprint["weight_budget_bytes"])
    plan = None if budget is None else _auto_plan(m, budget, stages)
    reasons = {r.name: r.reason for r in m.graph.resident}  # why each is kept, from the capture
    units = [
        {"index": u.index, "name": u.name, "type": u.module_type, "nbytes": u.nbytes,
         "payload_bytes": u.payload_bytes, "offset": u.offset, "d": u.d, "f": u.f, "sha256": u.sha256}
        for u in m.units
    ]
    info = {
        "model": m.model,
        "input_shape": list(m.input_shape),
        "input_dtype": m.input_dtype,
        "input_keywords": [{"name": n, "shape": list(shape), "dtype": d} for n, shape, d in m.input_keywords],
        "weights_file": m.weights_file,
        "weights_bytes": m.total_bytes,
        "largest_unit_bytes": m.largest_unit_bytes,
        "minimum_budget_bytes": streamed_minimum(m.units) + m.resident_bytes,
        "rows_units": sorted(gathered_units([u] for u in m.units)),
        "resident_bytes": m.resident_bytes,
        "resident_tensors": [
            {"name": t.name, "nbytes": t.nbytes, "places": list(t.places), "reason": reasons.get(t.name, "")}
            for t in (m.resident.tensors if m.resident else ())
        ],
        "unused_tensors": m.graph.unused,
        "capture": m.graph.method,
        "macs": m.graph.total_macs,
        "ops": len(m.graph.ops),
        "activation_tensors": len(m.graph.tensors),
        "pass_peak_bytes": m.graph.pass_peak_bytes,
        **_activation_info(m),
        "units": units,
    }
    if plan is not None:
        info["auto_plan"] = plan
    if footprint is not None:
        info["memory_limit"] = footprint
    if as_json:
        print_json(info)
        _check_weights_file(directory, m)
        return
    console.print(
        f"[bold]{m.model['name']}[/] input {_inputs_label(m)}: "
        f"{len(m.units)} units, {format_bytes(m.total_bytes)} weights, largest unit "
        f"{format_bytes(m.largest_unit_bytes)}, resident {format_bytes(m.resident_bytes)}, "
        f"{m.graph.total_macs / 1e9:.2f} GMACs, minimum budget "
        f"{format_bytes(info['minimum_budget_bytes'])}"
        + (
            f" (read in part: {_partial_units(m, info['rows_units'])})"
            if info["rows_units"]
            else ""
        )
        + "\n"
        f"activation arena {format_bytes(info['activation_arena_bytes'])} (offsets plan, best); planned "
        f"total at the minimum budget {format_bytes(info['planned_total_bytes'])}"
        + (
            f"; unplanned, the captured pass held {format_bytes(m.graph.pass_peak_bytes)} of tensors at its peak"
            if m.graph.pass_peak_bytes
            else ""
        )
    )
    if footprint is not None:
        console.print(limit_label(footprint), markup=False, highlight=False)
    _print_units(m, plan)
    if info["resident_tensors"]:
        # resident tensors count against every budget: say which they are and why
        kept = table("resident tensor", "bytes", "why it is not streamed", title="kept in memory for the whole inference")
        for r in sorted(info["resident_tensors"], key=lambda r: -r["nbytes"]):
            kept.add_row(r["name"], format_bytes(r["nbytes"]), r["reason"])
        console.print(kept)
    _check_weights_file(directory, m)


def _print_units(m: Manifest, plan: dict[str, Any] | None) -> None:
    """``inspect``'s table of units, and with ``--budget`` how auto spends it on them."""
    from layerfit.console import table
    from layerfit.sizes import format_bytes

    if plan is not None:
        head = f"at {format_bytes(plan['budget_bytes'])} ({plan['stages']} stages) pipeline auto runs {plan['policy']}: "
        if plan["policy"] == "preload":
            console.print(head + f"every weight resident ({format_bytes(m.total_bytes)}), read once at load")
        else:
            console.print(
                head + f"{len(plan['kept_units'])} of {len(m.units)} units kept resident "
                f"({format_bytes(plan['kept_bytes'])}), buffers "
                f"{format_bytes(plan['buffer_bytes'] + plan['device_buffer_bytes'])}"
                + (f", expert cache {format_bytes(plan['expert_cache_bytes'])}: {plan['expert_slots']} "
                   f"experts of {format_bytes(plan['expert_slot_bytes'])}, the ones chosen most"
                   if plan["expert_cache_bytes"] else "")
                + (f", the experts of {plan['experts_guessed_units']} MoE layers guessed a layer early and "
                   "read ahead" if plan["experts_guessed_units"] else "")
                + f"; each inference reads {plan['units_read_per_inference']} units, "
                f"{format_bytes(plan['bytes_read_per_inference'])}"
            )
    from layerfit.engine.experts import experts_segment

    kept = set() if plan is None else set(plan["kept_units"])
    rows = set() if plan is None else set(plan["rows_units"])
    units = table("#", "unit", "type", "bytes", "offset", "d", "MMACs", *(["auto"] if plan else []))
    for u in m.units:
        where = (
            ["kept" if u.index in kept or plan["policy"] == "preload"
             else ("experts" if experts_segment(u) else "rows") if u.index in rows else "read"]
            if plan
            else []
        )
        units.add_row(
            str(u.index), u.name, u.module_type, format_bytes(u.nbytes), str(u.offset), str(u.d), f"{u.f / 1e6:.1f}", *where
        )
    console.print(units)
    for column, meaning in UNITS_LEGEND:
        if column != "auto" or plan is not None:
            console.print(f"  {column}: {meaning}", style="dim", highlight=False, markup=False)


def _inputs_label(m: Manifest) -> str:
    """``(1, 3, 224, 224) float32``, or each keyword's for a model prepared from them."""
    if not m.input_keywords:
        return f"{tuple(m.input_shape)} {m.input_dtype}"
    return ", ".join(f"{n}={tuple(shape)} {d}" for n, shape, d in m.input_keywords)


def _measured_footprint(directory: str, memory_limit: str, budget: str | None) -> dict[str, int]:
    """The footprint an engine measures loading ``directory`` within ``memory_limit``
    (:mod:`layerfit.memory_limit`), as ``run --json`` reports it."""
    from layerfit.engine import EngineConfig, load

    with load(directory, EngineConfig.parse(memory_limit=memory_limit, budget=budget)) as engine:
        return engine.footprint.to_dict()


def _auto_plan(m: Manifest, budget: str, stages: int) -> dict[str, Any]:
    """How ``run --pipeline auto`` spends ``budget`` on the model's weights, by layer: the
    engine's own plan (:func:`layerfit.engine.plan.plan`), nothing loaded. Below the
    minimum: the engine's error."""
    from layerfit.engine.config import EngineConfig
    from layerfit.engine.plan import plan
    from layerfit.engine.skeleton import build_skeleton
    from layerfit.sizes import Budget

    config = EngineConfig(budget=Budget.parse(budget), pipeline="auto", stages=stages)
    # The skeleton says which tables are read by rows and which units an
    # encoder-decoder's decoder runs once per token; nothing is read from it.
    try:
        model = build_skeleton(m)
    except LayerfitError:  # its factory does not import here: nor would the engine load it
        model = None
    made = plan(m, config, model)
    weights, sizes = made.weights, [b.nbytes for b in made.blocks]
    slot, slots, guessed = _expert_slots(made, model)
    read = [] if weights.policy.resident else [
        i for i in range(len(sizes)) if i not in weights.kept and i not in weights.gathered
    ]
    return {
        "budget_bytes": made.budget_bytes,
        "stages": stages,
        "policy": weights.policy.name,
        "kept_units": sorted(weights.kept),
        "rows_units": sorted(weights.gathered),
        "kept_bytes": weights.kept_bytes,
        "buffer_bytes": weights.buffer_bytes,
        "device_buffer_bytes": weights.device_buffer_bytes,
        "expert_cache_bytes": weights.expert_cache_bytes,
        "expert_slot_bytes": slot,
        "expert_slots": slots,
        "experts_guessed_units": guessed,
        "units_read_per_inference": len(read),
        "bytes_read_per_inference": sum(sizes[i] for i in read),
    }


def _expert_slots(made: Any, model: Any) -> tuple[int, int, int]:
    """How the engine holds routed experts under the plan: (bytes of an expert cache
    slot, its slots, the routed units whose experts are guessed a layer early and read
    ahead), as :func:`layerfit.engine.expert_guess.expert_memory` decides (with the
    skeleton's routers; no guess without it)."""
    from layerfit.engine.expert_guess import plan_guesses, slot_plan
    from layerfit.engine.expert_places import compact_layout
    from layerfit.engine.experts import ExpertTable, experts_segment
    from layerfit.engine.skeleton import segment_bindings

    weights = made.weights
    tables = {i: ExpertTable(made.blocks[i].segments[0], []) for i in weights.gathered
              if experts_segment(made.blocks[i].segments[0])}
    if not tables:
        return 0, 0, 0
    slot, slots = slot_plan(weights.expert_cache_bytes, tables) if weights.expert_cache_bytes else (0, 0)
    if model is None or not made.config.expert_prefetch:
        return slot, slots, 0
    modules = dict(model.named_modules())
    for table in tables.values():  # (compact_layout asks the module which experts code it runs)
        table.bindings = segment_bindings(model, table.segment, 0, modules)
    compact = {i: t for i, t in tables.items() if compact_layout(t)}
    names = [seg.name for block in made.blocks for seg in block.segments if experts_segment(seg)]
    return slot, slots, len(plan_guesses(modules, names, compact))


def _check_weights_file(directory: str, m: Manifest) -> None:
    """After showing the manifest, refuse (exit 2) if its weights file is missing or the
    wrong size, so that a damaged model never looks healthy (``verify`` checks the bytes)."""
    from pathlib import Path

    from layerfit.store import check_weights_file

    check_weights_file(Path(directory) / m.weights_file, m.weights_size)


def _activation_info(m) -> dict[str, Any]:
    """The planned activation arena next to the minimum weight budget (Pisarchyk & Lee)."""
    from layerfit.engine.arena import memory_summary, plan_activations

    # Planned activations read embedding tables whole (the arena replays the captured ops).
    return memory_summary(plan_activations(m.graph), m.largest_unit_bytes + m.resident_bytes)


@app.command()
def verify(directory: str = typer.Argument(..., help="prepared model directory")) -> None:
    """Read every unit and check its SHA-256 against the manifest; warn of folders a killed
    ``prepare`` left beside it."""
    import warnings
    from pathlib import Path

    from layerfit.store.output_folder import stale_temporaries, stale_warning
    from layerfit.store.verify import verify_folder

    checked = verify_folder(directory)
    console.print(f"{directory}: {checked.segments} segments verified ({checked.io_mode} I/O)")
    for stale in stale_temporaries(Path(directory).absolute().parent):
        warnings.warn(stale_warning(stale), stacklevel=1)


def _read_safetensors(path: str, what: str, hint: str) -> dict[str, Any]:
    """The tensors of a .safetensors file (nothing unpickled); a clear error naming
    ``what`` (and ``hint``) for a missing or malformed file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except FileNotFoundError:
        raise InputError(f"{what}: no such file{hint}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(f"{what} is not a readable .safetensors file: {exc}{hint}") from None


def device_call(path: str | None, engine) -> tuple[tuple, dict]:
    """:func:`_load_call` for ``engine``, on its device."""
    args, keywords = _load_call(path, engine.manifest)
    to_device = engine.device.to_device
    return tuple(to_device(a) for a in args), {k: to_device(v) for k, v in keywords.items()}


def _load_call(path: str | None, manifest) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of ``run``'s call: the seeded default, ``--input``'s one tensor,
    or (a model prepared from an example of keyword arguments) ``--input``'s
    ``.safetensors`` file of them."""
    from layerfit.store import example_call

    if path is None:
        return example_call(manifest)
    if not manifest.input_keywords:
        return (_load_input(path, manifest),), {}
    tensors = _read_safetensors(
        path, f"input {path}", " (this model takes keyword arguments: give a .safetensors file of them)"
    )
    names = [name for name, _, _ in manifest.input_keywords]
    if sorted(tensors) != sorted(names):
        raise InputError(f"input {path} holds {', '.join(sorted(tensors)) or 'no tensors'}; the model takes {', '.join(names)}")
    for name, shape, dtype in manifest.input_keywords:
        t = tensors[name]
        if t.dim() != len(shape) or str(t.dtype).removeprefix("torch.") != dtype:
            raise InputError(
                f"input {path}: {name} is {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}; the model "
                f"was prepared with {dtype} {tuple(shape)} (the same dtype and number of dimensions are needed)"
            )
    return (), tensors


def _load_input(path: str | None, manifest):
    from layerfit.errors import InputError
    from layerfit.store import example_call

    if path is None:
        return example_call(manifest)[0][0]
    import numpy as np
    import torch

    if str(path).lower().endswith(".safetensors"):
        raise InputError(
            f"input {path} is a .safetensors file: this model takes one tensor, give it as a .npy file "
            "(numpy.save); a .safetensors file of named tensors is for a model prepared from keyword arguments"
        )
    _check_npy_header(path, manifest)
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, SyntaxError, TypeError, MemoryError, OverflowError) as exc:
        raise InputError(f"cannot read input {path}: {exc}") from exc
    if not isinstance(arr, np.ndarray):  # an .npz archive
        arr.close()
        raise InputError(f"input {path} is an .npz archive: save the one input tensor with numpy.save as .npy")
    if not arr.dtype.isnative:  # the same values in this machine's byte order
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return torch.from_numpy(arr)  # its shape and dtype were checked in the header


def _check_npy_header(path: str, manifest) -> None:
    """Read a ``.npy`` file's header only, and refuse one that is not an array of the
    model's input shape (any size on the axes it was prepared to vary: a text model's
    batch and length) and dtype (either byte order) before a byte of its data is read:
    a crafted header may declare terabytes, or a dtype that needs pickle. This is the
    one check of an ``.npy`` input's shape and dtype."""
    import numpy as np

    try:
        with open(path, "rb") as fh:
            if fh.read(6) != b"\x93NUMPY":
                return  # not .npy: np.load says what it is (.npz, or nothing it reads)
            fh.seek(0)
            version = np.lib.format.read_magic(fh)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read is None:
                raise ValueError(f"unknown .npy format version {version}")
            shape, _, dtype = read(fh)
    except FileNotFoundError:
        raise InputError(f"input {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"input {path} is a directory, not a .npy file") from None
    except Exception as exc:  # numpy parses the header with tokenize and ast: any of their errors
        raise InputError(f"cannot read input {path}: its .npy header is not valid ({type(exc).__name__}: {exc})") from None
    expected = tuple(manifest.input_shape)
    # a text model prepared with varying shapes takes any batch and length on its varying
    # axes (the engine refuses a length past its positions, in one line)
    varying = set(manifest.variable_shapes.axes_of("")) if manifest.variable_shapes is not None else set()
    fixed = [i for i in range(len(expected)) if i not in varying]
    native = _native_dtype_name(dtype)
    if (
        dtype.hasobject or len(shape) != len(expected) or any(shape[i] != expected[i] for i in fixed)
        or native != manifest.input_dtype
    ):
        hint = ""
        if not varying and native == manifest.input_dtype and len(shape) == len(expected):
            hint = (
                " (it was prepared with --fixed-shape: prepare it again without it to take other batches and lengths)"
                if manifest.model["source"] == "hf"  # hf: derives its input: --input-shape is refused there
                else f" (it was prepared for that shape: prepare it again with --input-shape {','.join(map(str, shape))})"
            )
        wanted = "(" + ", ".join("N" if i in varying else str(d) for i, d in enumerate(expected)) + ")"
        raise InputError(f"input {path} is {dtype} {tuple(shape)}; the model expects {manifest.input_dtype} {wanted}{hint}")


def _native_dtype_name(dtype) -> str | None:
    """A ``.npy`` header's dtype in this machine's byte order, by name (``float32``); None
    for a dtype without a byte order to ask for (numpy 2's strings), which no model takes."""
    try:
        return str(dtype.newbyteorder("="))
    except (TypeError, ValueError):
        return None


def _save_output(path: str, out) -> None:
    """Write the output tensors to ``path`` (.npy: the one output; .npz: every output),
    through a temporary file and a rename."""
    import numpy as np

    from layerfit.engine import flat_outputs
    from layerfit.store.outputs import write_atomic

    def into(save):  # through an open file: numpy appends .npy/.npz to a name not ending in it
        def write(tmp) -> None:
            with open(tmp, "wb") as fh:
                save(fh)

        return write

    outs = [t.detach().cpu().numpy() for t in flat_outputs(out)]
    if path.lower().endswith(".npz"):
        write_atomic(path, into(lambda fh: np.savez(fh, *outs)))
    elif len(outs) == 1:
        write_atomic(path, into(lambda fh: np.save(fh, outs[0])))
    else:
        from layerfit.errors import InputError

        raise InputError(f"the model has {len(outs)} outputs: save them to a .npz file")


def _pipeline_label(report: dict) -> str:
    """The pipeline that ran, and that ``auto`` chose it where it did."""
    if report["pipeline_requested"] == report["pipeline"]:
        return report["pipeline"]
    return f"{report['pipeline']}, chosen by {report['pipeline_requested']}"


def _units_label(report: dict) -> str:
    """How many units there are, how many ``auto`` keeps resident beside the buffer, and
    how many are embedding tables read by rows."""
    from layerfit.sizes import format_bytes

    notes = []
    if report["kept_units"]:
        notes.append(f"{report['kept_units']} kept resident, {format_bytes(report['kept_bytes'])}")
    if report.get("rows_units"):
        notes.append(f"{report['rows_units']} read by rows")
    return f"{report['units']} units" + (f" ({'; '.join(notes)})" if notes else "")


@app.command()
@engine_options(
    "pipeline", "budget", "memory_limit", "units", "direct_io", "activations", "coalesce", "gather_rows", "read_ahead", "expert_cache",
    "expert_prefetch", "dequantize", "device", "stages",
)
def run(
    directory: str = typer.Argument(..., help="prepared model directory"),
    options: EngineOptions = ENGINE_OPTIONS,  # --pipeline, --budget, --units, ... (engine_options)
    input_path: str = typer.Option(
        None, "--input", help="input .npy, or .safetensors of keyword arguments for a model prepared with "
        "--example (default: seeded random)",
    ),
    output_path: str = typer.Option(None, "--output", help="save the output to .npy/.npz"),
    repeats: int = typer.Option(3, "--repeats", min=1),
    warmup: int = typer.Option(1, "--warmup", min=0),
    trace: str = typer.Option(None, "--trace", help="write a Chrome trace of the median run"),
    threads: int | None = typer.Option(None, "--threads", help=COMPUTE_THREADS_HELP),
    force: bool = typer.Option(False, "--force", help="replace existing --output and --trace files"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Execute a prepared model under a weight budget and report latency and memory."""
    from layerfit.engine import load, measure
    from layerfit.sizes import format_bytes
    from layerfit.store.outputs import check_output_file

    # Checked before the model runs: finding out afterwards would lose the run.
    if output_path:
        check_output_file(output_path, force=force, option="--output", suffixes=(".npy", ".npz"))
    if trace:
        check_output_file(trace, force=force, option="--trace")
    set_compute_threads(threads, "--threads")
    budget = options["budget"]
    swapnet = options["units"] == "swapnet"  # the budget is the model's memory in all: SwapNet splits it
    if swapnet and options["memory_limit"] is not None:
        raise InputError("--units swapnet splits --budget between its blocks: with --memory-limit give layers, "
                         "blocks:N or merge:SIZE")
    config = options.config(trace=trace is not None, **({"budget": None, "units": "layers"} if swapnet else {}))
    if swapnet:
        import warnings

        from layerfit.tradeoff.swapnet import swapnet_engine_config

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                config = swapnet_engine_config(directory, budget, config)
            finally:
                print_warnings(caught)
    with load(directory, config) as engine:
        args, keywords = device_call(input_path, engine)
        out, report = measure(engine, args, repeats=repeats, warmup=warmup, keywords=keywords)
        if trace:
            engine.last_timeline.save(trace)
            report["trace"] = trace
    if output_path:
        _save_output(output_path, out)
    if as_json:
        report.pop("latencies_s", None)
        print_json(report)
        return
    console.print(
        f"{report['model']} [{_pipeline_label(report)}, {_units_label(report)}, {report['stages']} stages on "
        f"{report['device']}, {report['io_mode']} I/O, {kernels_on(report['compute_threads'])}]: "
        f"latency {report['latency_s'] * 1e3:.1f} ms (median of {repeats}), weights peak "
        f"{format_bytes(report['weights_peak_bytes'])} of {format_bytes(report['weights_total_bytes'])}, "
        f"peak RSS {format_bytes(report['rss_peak_bytes'])}\n"
        + (f"{limit_label(report['memory_limit'])}\n" if report["memory_limit"] else "")
        + f"activations {report['activations']}: planned arena {format_bytes(report['activation_arena_bytes'])}, "
        f"planned total {format_bytes(report['planned_total_bytes'])} (weight buffers + arena)\n"
        f"output {report['output_shape']} sha256 {report['output_sha256'][:16]}",
        markup=False,  # the [pipeline, ...] part is text, not a rich style tag
    )
