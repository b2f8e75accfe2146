"""Records (mutor2d.lm.records) -> token ids: each prompt and answer rendered (chat lines through the
tokenizer's chat template, one example per trained assistant turn) and tokenized; evaluation prompts
with their gold answers. Over-long prompts keep their last tokens, over-long answers their first."""
from __future__ import annotations

from .records import DataError


def check_chat_template(tokenizer, where: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{where}: chat lines need a tokenizer with a chat template; "
                        f"{getattr(tokenizer, 'name_or_path', '') or 'this tokenizer'!s} has none")


def chat_prompt(messages: list[dict], tokenizer) -> str:
    """The rendered conversation ``messages`` followed by the assistant's generation prompt."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render(rec: dict, tokenizer, where: str) -> list[tuple[str, str, bool]]:
    """A record -> [(prompt text, answer text, templated)]; chat records give one per trained assistant turn."""
    if "messages" not in rec:
        return [(rec["prompt"], rec["answer"], False)]
    check_chat_template(tokenizer, where)
    messages = rec["messages"]
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant" and k >= rec["train_from"]]
    if not turns:
        raise DataError(f"{where}: no assistant turn to train on")
    out = []
    for k in turns:
        prompt = chat_prompt(messages[:k], tokenizer)
        full = tokenizer.apply_chat_template(messages[:k + 1], tokenize=False)
        if not full.startswith(prompt):
            raise DataError(f"{where}: the chat template does not render the turns before assistant "
                            f"turn {k} as a prefix of the conversation; cannot mask the loss")
        out.append((prompt, full[len(prompt):], True))
    return out


def encode_prompt(text: str, tokenizer, templated: bool) -> list[int]:
    """Prompt ids: with the tokenizer's special tokens, unless the text is a rendered chat template."""
    return tokenizer(text, add_special_tokens=not templated)["input_ids"]


def tokenize(records: list[dict], tokenizer, max_prompt_len: int, max_answer_len: int,
             add_eos: bool = True, where: list[str] | None = None) -> list[tuple[list[int], list[int]]]:
    """-> [(prompt ids, answer ids)]; DataError (at ``where``'s "FILE:LINE") for an empty prompt or < 2 token answer."""
    out = []
    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []
    for n, rec in enumerate(records):
        at = where[n] if where else f"record {n}"
        for prompt_text, answer_text, templated in render(rec, tokenizer, at):
            prompt = encode_prompt(prompt_text, tokenizer, templated)[-max_prompt_len:]
            answer = tokenizer(answer_text, add_special_tokens=False)["input_ids"]
            answer = (answer + ([] if templated else eos))[:max_answer_len]
            if len(prompt) < 1 or len(answer) < 2:
                raise DataError(f"{at}: prompt/answer of {len(prompt)}/{len(answer)} tokens, "
                                "expected >= 1 / >= 2")
            out.append((prompt, answer))
    return out


def eval_prompts(located: list[tuple[str, dict]], tokenizer) -> list[dict]:
    """Evaluation items {"prompt", "prompt_ids", "gold"} per record (chat: before its last assistant turn)."""
    items = []
    for where, rec in located:
        if "messages" in rec:
            check_chat_template(tokenizer, where)
            messages = rec["messages"]
            last = max((k for k, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
            prompt, templated = chat_prompt(messages[:last], tokenizer), True
            gold = rec.get("gold", messages[last]["content"] if last < len(messages) else None)
        else:
            prompt, templated, gold = rec["prompt"], False, rec.get("gold", rec["answer"])
        if gold is None:
            raise DataError(f"{where}: no gold answer (add a 'gold' field or a final assistant turn)")
        items.append({"prompt": prompt, "prompt_ids": encode_prompt(prompt, tokenizer, templated), "gold": gold})
    return items
