"""The generation rules every caller shares (:mod:`layerfit.schedule.decoding.rules`):
a chat's messages checked and made into the tokenizer's own chat-template ids, how new
tokens are counted (the end token that ended a generation counts, nothing after it), and
which guesses of several tokens per pass may be asked for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layerfit.errors import InputError
from layerfit.schedule.decoding.rules import (
    PROMPT_LOOKUP_MAX,
    Speculation,
    chat_prompt_ids,
    check_messages,
    completion_token_count,
    generated_tokens,
    tokens_per_pass,
)

TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s> assistant\n{% endif %}"
)


def _tokenizer(template: str | None = TEMPLATE):
    """A word-level tokenizer whose spaces and newlines are tokens of their own, so that a
    lost trailing newline changes the ids."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, " ": 3, "\n": 4, "system": 5, "user": 6, "assistant": 7,
             **{f"w{i}": i + 8 for i in range(20)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Split(Regex(r"[ \n]"), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = template
    return tokenizer


def test_chat_ids_are_the_templates_own_with_the_trailing_newline() -> None:
    tokenizer = _tokenizer()
    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3"}]
    ids = chat_prompt_ids(tokenizer, check_messages(messages))
    assert ids == list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert ids[-2:] == [7, 4]  # "assistant\n": the newline the template ends with is a token
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer(text.rstrip("\n"), add_special_tokens=False)["input_ids"] != ids  # what `$(cat file)` did


def test_a_tokenizer_without_a_template_or_a_failing_one_is_one_line() -> None:
    messages = [{"role": "user", "content": "w1"}]
    with pytest.raises(InputError, match="'lm''s tokenizer has no chat template"):
        chat_prompt_ids(_tokenizer(None), messages, model="'lm'")
    failing = _tokenizer("{{ raise_exception('roles must alternate user/assistant') }}")
    with pytest.raises(InputError, match="chat template failed on the messages: .*roles must alternate") as caught:
        chat_prompt_ids(failing, messages)
    assert "\n" not in str(caught.value)
    broken = _tokenizer("{% for m in messages %}")  # a Jinja syntax error
    with pytest.raises(InputError, match="chat template failed"):
        chat_prompt_ids(broken, messages)


@pytest.mark.parametrize(("messages", "needle"), [
    ({"role": "user", "content": "hi"}, "must be a non-empty list"),
    ([], "must be a non-empty list"),
    (["hi"], "message 1 is not an object"),
    ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], "message 2 has role 'robot': a role is one of"),
    ([{"content": "b"}], "message 1 has role None"),
    ([{"role": "user", "content": 3}], "message 1 (user) has no text \"content\""),
    ([{"role": "user"}], "no text \"content\""),
    ([{"role": "user", "content": "a", "name": "x"}], "has 'name': a message holds only"),
])
def test_bad_messages_are_one_line(messages, needle: str) -> None:
    with pytest.raises(InputError) as caught:
        check_messages(messages, "messages.json")
    assert needle in str(caught.value) and str(caught.value).startswith("messages.json")


@given(st.lists(st.integers(0, 9), max_size=30), st.sets(st.integers(0, 9), max_size=3))
def test_the_count_is_every_token_made_up_to_and_with_the_first_end(new_ids: list[int], ends: set[int]) -> None:
    made = generated_tokens(new_ids, ends)
    assert completion_token_count(new_ids, ends) == len(made)
    assert made == new_ids[:len(made)]  # a prefix of what came
    assert not any(t in ends for t in made[:-1])  # no end token before the last
    if len(made) < len(new_ids):
        assert made[-1] in ends  # cut only after an end token, which counts
    else:
        assert made == new_ids


def test_the_end_token_counts_once() -> None:
    assert completion_token_count([5, 6, 2], {2}) == 3  # 2 ended it, and counts
    assert completion_token_count([5, 6, 2, 7, 8], {2}) == 3  # made past the end: not this sequence's
    assert completion_token_count([5, 6], {2}) == 2
    assert tokens_per_pass(30, 10) == 3.0 and tokens_per_pass(0, 0) is None


@pytest.mark.parametrize(("speculation", "needle"), [
    (Speculation(prompt_lookup=8, draft="d"), "--prompt-lookup and --draft are two ways"),
    (Speculation(prompt_lookup=0), f"from 1 to {PROMPT_LOOKUP_MAX}, not 0"),
    (Speculation(prompt_lookup=PROMPT_LOOKUP_MAX + 1), "from 1 to"),
    (Speculation(prompt_lookup=True), "not True"),
])
def test_speculation_refuses_both_and_lookups_out_of_range(speculation: Speculation, needle: str) -> None:
    with pytest.raises(InputError, match=needle.replace("(", r"\(")):
        speculation.check()


def test_speculation_names_the_settings_as_the_caller_spells_them() -> None:
    with pytest.raises(InputError, match="prompt_lookup and draft are two ways"):
        Speculation(prompt_lookup=4, draft="d").check(lookup="prompt_lookup", draft="draft")
    Speculation(prompt_lookup=PROMPT_LOOKUP_MAX).check()
    Speculation(draft="d").check()
    assert Speculation(draft="d").active and not Speculation().active
