"""Token ids of the text an environment inserts between two model turns of a chat.

A multi-step episode keeps the ids the model sampled as they are (re-tokenising the decoded text
could give different ids than the ones whose log-probs were recorded) and appends, after each
model turn, the ids of ``end of the assistant turn + user turn(observation) + assistant header``.
That text is derived from the tokenizer's own chat template, so any template works.
"""

from __future__ import annotations

_USER = "\x00USER\x00"
_ASSISTANT = "\x00ASSISTANT\x00"
_OBSERVATION = "\x00OBSERVATION\x00"


def _template_pieces(tokenizer) -> tuple[str, str]:
    """(text after an assistant message's content, text of a user turn + generation prompt with
    the observation placeholder)."""
    turn = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
    closed = tokenizer.apply_chat_template(turn, tokenize=False)
    extended = tokenizer.apply_chat_template(
        [*turn, {"role": "user", "content": _OBSERVATION}], tokenize=False, add_generation_prompt=True
    )
    if not extended.startswith(closed):
        raise ValueError(
            "the chat template re-renders earlier turns when a turn is added; cannot append turns"
        )
    after_assistant = closed[closed.index(_ASSISTANT) + len(_ASSISTANT) :]
    return after_assistant, extended[len(closed) :]


def observation_ids(tokenizer, observation: str, *, model_closed_turn: bool) -> list[int]:
    """Ids appended after a model turn: the rest of the assistant turn's closing text, the user
    turn holding ``observation`` and the next assistant header.

    ``model_closed_turn``: the model's sample already ended with the end-of-turn token (eos), so
    that token is not inserted again; after a length-truncated turn the closing text is inserted
    whole.
    """
    after_assistant, user_turn = _template_pieces(tokenizer)
    eos_text = tokenizer.eos_token or ""
    if model_closed_turn and eos_text and after_assistant.startswith(eos_text):
        after_assistant = after_assistant[len(eos_text) :]
    text = after_assistant + user_turn.replace(_OBSERVATION, observation)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
