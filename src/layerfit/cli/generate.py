"""``layerfit generate DIR --prompt TEXT``: a language model's own ``generate`` (Hugging
Face's) on a prepared folder, every forward pass streamed within the weight budget.

Transformers' ``generate`` stays here, beside the runtime's decode loop that serves the
server and :meth:`~layerfit.schedule.runtime.executor.Runtime.generate`: the command
promises the model's own tokens bit for bit, with every processor the folder's generation
config may name, sampling from the global seed, and encoder-decoders (why, in
:mod:`layerfit.schedule.decoding.rules`). Which models generate, the tokenizer files and
how they are read, and the prompt's checks (vocabulary, positions) are that module's
rules, the loop's too.

The prompt is text read by a tokenizer (``--tokenizer FOLDER``, else the prepared folder's
own tokenizer files), token ids (``--ids``, no tokenizer needed) or a chat made by the
tokenizer's own chat template (``--chat``, ``--system``, ``--messages FILE``:
:mod:`.prompt_input`). The new tokens are printed on stdout as they are made (text, or
ids without a tokenizer) and a summary on stderr: the prompt's and the new tokens' counts
(the end token the model made counts: the rule of
:func:`~layerfit.schedule.decoding.rules.completion_token_count`), the model's passes, the
time to the first new token, the decode rate after it and the most weight bytes any pass
held, beside the budget. ``--json`` prints all of it as one object instead. Greedy unless
``--do-sample``; the folder's ``generation_config.json`` (when it has one) gives generate's
defaults and the flags override them. ``--prompt-lookup N`` and ``--draft DIR`` make
several tokens per pass (:mod:`.speculation`). Everything the command line can get wrong
is checked before a token is made, each as one line (:class:`~layerfit.errors.InputError`).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from layerfit.cli.app import app, limit_label, print_json
from layerfit.cli.engine_options import ENGINE_OPTIONS, EngineOptions, engine_options
from layerfit.cli.prompt_input import PromptInput
from layerfit.console import make_console
from layerfit.engine.openmp import COMPUTE_THREADS_HELP, kernels_on, set_compute_threads
from layerfit.errors import InputError
from layerfit.schedule.decoding.rules import (
    PROMPT_LOOKUP_MAX,
    TOKENIZER_FILES,
    Refusal,
    Speculation,
    has_tokenizer,
    refusal,
)

if TYPE_CHECKING:
    from layerfit.engine import Engine
    from layerfit.store.manifest import Manifest

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class Decoding:
    """How to choose each new token, as the command line gave it: greedy unless
    ``do_sample``; the sampling settings left None take the generation config's."""

    max_new_tokens: int
    do_sample: bool
    temperature: float | None
    top_k: int | None
    top_p: float | None
    seed: int | None

    def check(self) -> None:
        """Refuse values generate would refuse late, or ignore without a word."""
        if self.max_new_tokens < 1:
            raise InputError(f"--max-new-tokens must be 1 or more, not {self.max_new_tokens}")
        given = [flag for flag, value in self._sampling_flags() if value is not None]
        if given and not self.do_sample:
            settings = "is a sampling setting" if len(given) == 1 else "are sampling settings"
            raise InputError(f"{' and '.join(given)} {settings}: add --do-sample (greedy decoding ignores them)")
        if self.temperature is not None and not self.temperature > 0:
            raise InputError(f"--temperature must be above 0, not {self.temperature} (greedy decoding is the default)")
        if self.top_k is not None and self.top_k < 0:
            raise InputError(f"--top-k must be 0 (off) or more, not {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InputError(f"--top-p must be in (0, 1], not {self.top_p}")

    def generate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``generate`` that override the generation config."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample}
        for name in ("temperature", "top_k", "top_p"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs

    def _sampling_flags(self) -> list[tuple[str, Any]]:
        return [("--temperature", self.temperature), ("--top-k", self.top_k), ("--top-p", self.top_p)]


@app.command()
@engine_options(
    "pipeline", "budget", "memory_limit", "units", "direct_io", "coalesce", "gather_rows", "read_ahead", "expert_cache", "expert_prefetch",
    "dequantize", "device", "stages",
)
def generate(
    directory: str = typer.Argument(..., help="prepared model directory (a Hugging Face language model)"),
    prompt: str | None = typer.Option(None, "--prompt", help="the prompt as text (read by the tokenizer); with --chat the user's message"),
    ids: str | None = typer.Option(None, "--ids", help="the prompt as token ids, e.g. 1,2,3 (no tokenizer needed)"),
    chat: bool = typer.Option(False, "--chat", help="make --prompt the user's message of a chat, through the tokenizer's chat template"),
    system: str | None = typer.Option(None, "--system", help="with --chat: the system message before the user's"),
    messages: str | None = typer.Option(
        None, "--messages", help='a chat as a JSON file: [{"role": "system"|"user"|"assistant", "content": "..."}, ...]'
    ),
    tokenizer_dir: str | None = typer.Option(
        None, "--tokenizer", help="a folder of tokenizer files (default: DIR's own, when it has them)"
    ),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="tokens to make at most (the end token counts)"),
    do_sample: bool = typer.Option(False, "--do-sample", help="sample each token (default: greedy)"),
    temperature: float | None = typer.Option(None, "--temperature", help="with --do-sample: above 0"),
    top_k: int | None = typer.Option(None, "--top-k", help="with --do-sample: sample from the k likeliest (0: all)"),
    top_p: float | None = typer.Option(None, "--top-p", help="with --do-sample: nucleus, in (0, 1]"),
    seed: int | None = typer.Option(None, "--seed", help="seed of the sampling: the same seed makes the same tokens"),
    prompt_lookup: int | None = typer.Option(
        None, "--prompt-lookup", help=f"guess up to N next tokens from the prompt, verified by one pass (1-{PROMPT_LOOKUP_MAX})"
    ),
    draft: str | None = typer.Option(
        None, "--draft", help="a small prepared model of the same tokenizer that guesses tokens, held whole, its bytes in --budget"
    ),
    options: EngineOptions = ENGINE_OPTIONS,  # --pipeline, --budget, --units, ... (engine_options)
    threads: int | None = typer.Option(None, "--threads", help=COMPUTE_THREADS_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of the streamed text"),
) -> None:
    """Generate text with a prepared language model, its weights streamed within the budget."""
    decoding = Decoding(max_new_tokens, do_sample, temperature, top_k, top_p, seed)
    decoding.check()
    speculation = Speculation(prompt_lookup, draft)
    speculation.check()
    if options["units"] == "swapnet":
        raise InputError("--units swapnet partitions one pass for `layerfit run`: here give layers, blocks:N or merge:SIZE")
    given = PromptInput.parse(prompt, ids, chat, system, messages)

    import torch  # after the checks of the command line alone, which need none of it

    from layerfit.cli import speculation as speculative
    from layerfit.cli.token_stream import TokenStream
    from layerfit.engine.generation import PassCount

    manifest = _check_folder(directory)
    draft_manifest = None if draft is None else _check_folder(draft, "--draft ")
    tokenizer_folder = _tokenizer_folder(directory, tokenizer_dir)
    tokenizer = _load_tokenizer(tokenizer_folder)
    set_compute_threads(threads, "--threads")
    # A memory limit reserves the KV cache of every position the generation may reach.
    known_ids = given.token_ids(tokenizer, directory) if tokenizer is not None or not given.needs_tokenizer else None
    config = options.config(kv_positions=len(known_ids or ()) + decoding.max_new_tokens)
    with contextlib.ExitStack() as held:
        drafter = None
        if draft is not None:  # first: a memory limit then measures a process that holds it
            from layerfit.engine import load

            drafter = held.enter_context(load(draft, speculative.draft_config(config)))
            _check_generates(drafter, draft, draft_manifest)
        engine = held.enter_context(speculative.load_target(directory, config, drafter, f"--draft {draft}"))
        _check_generates(engine, directory, manifest)
        if known_ids is None:  # said after what the model is: that comes first
            raise InputError(
                f"{given.source} needs a tokenizer and {directory} holds none ({' or '.join(TOKENIZER_FILES)}): "
                "pass --tokenizer FOLDER, or give the prompt as token ids with --ids 1,2,3"
            )
        prompt_ids = known_ids
        _check_prompt(engine, prompt_ids, decoding.max_new_tokens)
        # One generation config, the flags set on a copy of the folder's (or the model's):
        # transformers deprecates passing a config together with generation arguments.
        generation_config = copy.deepcopy(_generation_config(directory) or engine.model.generation_config)
        generation_config.update(**decoding.generate_kwargs(), **speculative.config_settings(speculation))
        speculative.check(engine, drafter, generation_config, speculation)
        stream = TokenStream(tokenizer, not as_json, lambda: engine.last_weights_peak, lambda: engine.bytes_read)
        inputs = torch.tensor([prompt_ids], dtype=torch.long, device=engine.device.torch_device)
        if seed is not None:
            torch.manual_seed(seed)
        passes = PassCount()
        stream.begin()
        engine.generate(
            inputs, attention_mask=torch.ones_like(inputs), generation_config=generation_config,
            streamer=stream, passes=passes, **({} if drafter is None else {"assistant_model": drafter}),
        )
        report = _report(engine, directory, given, prompt_ids, stream, tokenizer, decoding)
        report.update(_counts(stream, generation_config, passes, speculation, drafter))
    if as_json:
        print_json(report)
    else:
        _print_summary(report)


def _check_folder(directory: str, flag: str = "") -> Manifest:
    """The manifest of ``directory`` (``flag``'s, named in errors: ``--draft``), once it
    is known to be a prepared model: one that does not exist, is not a directory, is a
    Hugging Face folder not yet prepared, or is a zoo model (never a language model) is
    refused saying so, before anything is said about its tokenizer (which would send the
    user the wrong way)."""
    from layerfit.store.manifest import is_unprepared_hf_folder, read_manifest, unprepared_hint

    folder = Path(directory)
    if not folder.exists():
        raise InputError(
            f"{flag}{directory} does not exist: generate takes the folder of a prepared language model "
            f"(`layerfit prepare hf:FOLDER -o {directory}`)"
        )
    if not folder.is_dir():
        raise InputError(f"{flag}{directory} is not a directory: generate takes the folder of a prepared language model")
    if is_unprepared_hf_folder(folder):
        raise InputError(f"{unprepared_hint(directory)}, then generate from OUT")
    manifest = read_manifest(folder)  # one line for a folder that is not a prepared model
    if refusal(manifest, batched=False) is Refusal.NOT_HUGGING_FACE:  # the zoo: the papers' CNNs and ViTs
        raise InputError(_not_a_language_model(directory, manifest.model["name"]))
    return manifest


def _not_a_language_model(directory: str, name: str, kind: str | None = None) -> str:
    held = name if kind is None or kind == name else f"{name} ({kind})"
    return (
        f"{directory} holds {held}, not a language model (it has no Hugging Face generate method): "
        f"generate runs language models; run this one with `layerfit run {directory}`"
    )


def _tokenizer_folder(directory: str, given: str | None) -> Path | None:
    """The folder to read the tokenizer from: ``--tokenizer``'s, else ``directory`` when
    it holds tokenizer files, else None (an error, once the model is known to be a
    language model, when the prompt is text)."""
    if given is not None:
        folder = Path(given)
        if not folder.is_dir() or not has_tokenizer(folder):  # never a Hub name: nothing is downloaded
            raise InputError(
                f"--tokenizer {given} is not a folder of tokenizer files ({' or '.join(TOKENIZER_FILES)}): "
                "give the folder a tokenizer was saved to (save_pretrained)"
            )
        return folder
    if has_tokenizer(Path(directory)):
        return Path(directory)
    return None


def _load_tokenizer(folder: Path | None) -> Any | None:
    """The tokenizer saved in ``folder`` (None: none), from local files only and running
    no code the folder names (``trust_remote_code`` stays off)."""
    if folder is None:
        return None
    from layerfit.schedule.decoding.rules import read_tokenizer

    try:
        return read_tokenizer(folder)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise InputError(f"cannot read a tokenizer from {folder}: {_one_line(exc)}") from None


def _check_generates(engine: Engine, directory: str, manifest: Manifest) -> None:
    """Refuse a model that has no Hugging Face ``generate`` fed token ids (the rule of
    :func:`~layerfit.schedule.decoding.rules.refusal`, asked of the skeleton)."""
    model = engine.model
    kind = refusal(manifest, model, batched=False)
    if kind is Refusal.NOT_TOKEN_IDS:
        raise InputError(f"{type(model).__name__} generates from {model.main_input_name}, not token ids: generate takes a text prompt")
    if kind is not None:
        raise InputError(_not_a_language_model(directory, manifest.model["name"], type(model).__name__))


def _check_prompt(engine: Engine, prompt_ids: list[int], max_new_tokens: int) -> None:
    """Refuse ids outside the vocabulary, and a prompt and new tokens beyond the model's
    positions (an encoder-decoder's prompt and new tokens each within its own): the
    loop's rules (:mod:`layerfit.schedule.decoding.rules`)."""
    from layerfit.schedule.decoding.rules import check_generation_length, check_prompt_ids, vocab_of

    check_prompt_ids(prompt_ids, vocab_of(engine.model), "the model's vocabulary")
    check_generation_length(engine.model.config, len(prompt_ids), max_new_tokens, tokens="--max-new-tokens")


def _generation_config(directory: str) -> Any | None:
    """The folder's ``generation_config.json`` (None: it has none, and generate takes the
    skeleton's own, made from the model's config)."""
    if not (Path(directory) / GENERATION_CONFIG).is_file():
        return None
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"cannot read {Path(directory) / GENERATION_CONFIG}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    """A library's message (transformers' span lines) as one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _report(
    engine: Engine, directory: str, given: PromptInput, prompt_ids: list[int], stream: Any, tokenizer: Any | None,
    decoding: Decoding,
) -> dict[str, Any]:
    """Everything ``--json`` prints, and the summary reads."""
    import torch

    from layerfit.engine.osmem import peak_rss_bytes

    text = None if tokenizer is None else tokenizer.decode(stream.tokens, skip_special_tokens=True)
    return {
        "model": engine.manifest.model["name"],
        "directory": directory,
        "prompt": given.text,
        "messages": given.messages,
        "prompt_ids": prompt_ids,
        "prompt_tokens": len(prompt_ids),
        "token_ids": stream.tokens,
        "text": text,
        "prompt_latency_s": stream.prompt_latency_s,
        "decode_tokens_per_s": stream.decode_tokens_per_s,
        "read_bytes_per_token": stream.read_bytes_per_token,
        "weights_peak_bytes": stream.peak_bytes,
        "budget_bytes": engine.plan.budget_bytes if engine.plan is not None else None,
        "memory_limit": None if engine.footprint is None else engine.footprint.to_dict(),
        "rss_peak_bytes": peak_rss_bytes(),
        "weight_buffer_bytes": engine.memory.weight_bytes,
        "weights_total_bytes": engine.memory.total_weight_bytes,
        "pipeline": engine.policy.name,
        "pipeline_requested": engine.pipeline,
        "device": str(engine.device.torch_device),
        "compute_threads": torch.get_num_threads(),
        "generation": asdict(decoding),
    }


def _counts(
    stream: Any, generation_config: Any, passes: Any, speculation: Speculation, draft: Engine | None,
) -> dict[str, Any]:
    """The report's counts: the new tokens by the rule of
    :func:`~layerfit.schedule.decoding.rules.completion_token_count` (the end token the
    model made counts), whether an end token ended them, the model's passes, the tokens
    per pass, what guessed them and the overall rate (the first token's wait included)."""
    from layerfit.schedule.decoding.rules import completion_token_count, end_tokens, tokens_per_pass

    ends = end_tokens(generation_config, None)  # what generate stops on
    new = completion_token_count(stream.tokens, ends)
    took = stream.times[-1] - stream.started if stream.times else None
    return {
        "new_tokens": new,
        "ended": new > 0 and stream.tokens[new - 1] in ends,
        "passes": passes.model,
        "tokens_per_pass": tokens_per_pass(new, passes.model),
        "tokens_per_s": new / took if took else None,
        "prompt_lookup": speculation.prompt_lookup,
        "draft": None if draft is None else {
            "directory": speculation.draft, "model": draft.manifest.model["name"], "passes": passes.draft,
            "weights_bytes": draft.memory.weight_bytes,
        },
    }


def _print_summary(report: dict[str, Any]) -> None:
    """The summary on stderr, so that stdout holds the generated text alone."""
    from layerfit.sizes import format_bytes

    latency, rate, read = report["prompt_latency_s"], report["decode_tokens_per_s"], report["read_bytes_per_token"]
    budget = report["budget_bytes"]
    draft, per_pass = report["draft"], report["tokens_per_pass"]
    guesses = ("" if report["prompt_lookup"] is None and draft is None else
               f", {per_pass:.2f} a pass, guessed by " + (f"prompt lookup of {report['prompt_lookup']}" if draft is None
                                                          else f"the draft ({format_bytes(draft['weights_bytes'])})"))
    make_console(stderr=True).print(
        f"prompt {report['prompt_tokens']} tokens, {report['new_tokens']} new"
        f"{' (the last the end token)' if report['ended'] else ''} in {report['passes']} passes{guesses}: first new token after "
        f"{'n/a' if latency is None else f'{latency * 1e3:.1f} ms'}, then "
        f"{'n/a' if rate is None else f'{rate:.1f} tokens/s'}"
        f"{'' if read is None else f' reading {format_bytes(int(read))} a token'}; weights peak {format_bytes(report['weights_peak_bytes'])} "
        f"of {'no budget' if budget is None else f'a {format_bytes(budget)} budget'} "
        f"({format_bytes(report['weights_total_bytes'])} of weights; {report['pipeline']} on {report['device']}, "
        f"{kernels_on(report['compute_threads'])})"
        + (f"\n{limit_label(report['memory_limit'])}, peak RSS {format_bytes(report['rss_peak_bytes'])}"
           if report["memory_limit"] else ""),
        markup=False, highlight=False, soft_wrap=True,
    )


__all__ = ["Decoding", "generate"]
