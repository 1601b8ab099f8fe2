"""The prompt of ``layerfit generate`` as its flags give it: text (``--prompt``), token ids
(``--ids``), or a chat — ``--chat`` makes ``--prompt`` the user's message (``--system TEXT``
a system message before it), ``--messages FILE`` a JSON list of ``{"role", "content"}``
objects — that the tokenizer's own chat template makes into the prompt.

The chat's ids are exactly those of ``tokenizer.apply_chat_template(messages,
add_generation_prompt=True)`` (the rule, :func:`~layerfit.schedule.decoding.rules.chat_prompt_ids`):
the template's text tokenized as it stands, never passed through a shell or a file that
could drop its trailing newline, which changes the answer. ``--messages``' file is read
as a model folder's files are (:class:`~layerfit.store.folder_files.FolderFiles`: a
regular file inside its folder, not a link out of it, of bounded size, strict JSON), and
its messages checked (:func:`~layerfit.schedule.decoding.rules.check_messages`): each
thing wrong is one line. Importing this module imports no PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerfit.errors import InputError

MESSAGES_MAX_BYTES = 4 * 2**20
"""The largest ``--messages`` file: far beyond any model's positions in text."""


@dataclass(frozen=True)
class PromptInput:
    """The prompt as the command line gave it, its flags checked together (:meth:`parse`):
    ``text`` (``--prompt``: the whole prompt, or with ``--chat`` the user's message),
    ``ids`` (``--ids``), or a chat's ``messages`` (``--chat`` with ``--system``, or
    ``--messages``' file, read and checked)."""

    text: str | None = None
    ids: list[int] | None = None
    messages: list[dict[str, str]] | None = None
    source: str = "--prompt"  # the flag the prompt came from, for an error that needs a tokenizer

    @classmethod
    def parse(
        cls, prompt: str | None, ids: str | None, chat: bool = False, system: str | None = None,
        messages: str | None = None,
    ) -> PromptInput:
        """The prompt the flags give, or one line saying which flags do not go together or
        what is wrong with the messages."""
        from layerfit.schedule.decoding.rules import check_messages

        given = [flag for flag, value in (("--prompt", prompt), ("--ids", ids), ("--messages", messages)) if value is not None]
        if len(given) != 1:
            raise InputError(
                "give the prompt as --prompt TEXT or as token ids with --ids 1,2,3 (one of the two), or as a chat "
                "with --messages FILE" + ("" if not given else f", not {' and '.join(given)} together")
            )
        if ids is not None and (chat or system is not None):
            flag = "--chat" if chat else "--system"
            raise InputError(f"{flag} makes a chat of text with the chat template: give the message with --prompt, not --ids")
        if messages is not None and system is not None:
            raise InputError("--system with --messages: put the system message in the messages file")
        if system is not None and not chat:
            raise InputError("--system is a chat's system message: add --chat (the prompt is then the user's message)")
        if messages is not None:
            return cls(messages=check_messages(read_messages_file(messages), messages), source="--messages")
        if chat:
            said = [] if system is None else [{"role": "system", "content": system}]
            return cls(prompt, messages=check_messages([*said, {"role": "user", "content": prompt}], "--chat"),
                       source="--chat")
        return cls(prompt, _parse_ids(ids))

    def token_ids(self, tokenizer: Any, model: str) -> list[int]:
        """The prompt's token ids: ``--ids``', the text's through ``tokenizer``, or the
        chat's through ``tokenizer``'s chat template (``model`` names whose, in errors)."""
        from layerfit.schedule.decoding.rules import chat_prompt_ids

        if self.ids is not None:
            return self.ids
        if self.messages is not None:
            return chat_prompt_ids(tokenizer, self.messages, model)
        ids = [int(i) for i in tokenizer(self.text or "")["input_ids"]]
        if not ids:
            raise InputError("the prompt makes no tokens: give some text (or --ids)")
        return ids

    @property
    def needs_tokenizer(self) -> bool:
        """Whether the prompt is text (or a chat), which only a tokenizer makes ids of."""
        return self.ids is None


def read_messages_file(path: str) -> Any:
    """The JSON document of ``--messages``' file: a regular file inside its folder (not a
    link out of it), at most :data:`MESSAGES_MAX_BYTES`, strict JSON; one line otherwise."""
    from layerfit.store.folder_files import FolderFiles

    file = Path(path)
    if file.is_dir():
        raise InputError(f"--messages {path} is a directory: give a JSON file of chat messages")
    return FolderFiles(file.parent).json(file.name, MESSAGES_MAX_BYTES)


def _parse_ids(ids: str | None) -> list[int] | None:
    """``--ids``' token ids (None: not given)."""
    if ids is None:
        return None
    try:
        parsed = [int(p) for p in ids.replace(" ", ",").split(",") if p.strip()]
    except ValueError:
        parsed = []
    if not parsed or any(i < 0 for i in parsed):
        raise InputError(f"cannot read --ids {ids!r}: write token ids, 0 or more, like 1,2,3")
    return parsed


__all__ = ["MESSAGES_MAX_BYTES", "PromptInput", "read_messages_file"]
