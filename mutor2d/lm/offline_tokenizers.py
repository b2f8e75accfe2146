"""Tokenizers that need no download: one id per character or per word (Hugging Face
PreTrainedTokenizerFast over a WordLevel vocabulary), for tiny runs, tests and studies."""
from __future__ import annotations


def _offline_tokenizer(symbols: list[str], split, decoder, model_max_length: int):
    """A WordLevel PreTrainedTokenizerFast: specials <pad>=0, <bos>=1, <eos>=2, <unk>=3, then one id per
    symbol (sorted); ``split`` cuts text into symbols, ``decoder`` joins them (None: with single
    spaces); BOS is prepended to prompts."""
    from tokenizers import Tokenizer, models, processors
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(symbols)))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer, tk.decoder = split, decoder
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", model_max_length=model_max_length)


def char_tokenizer(chars: str, model_max_length: int = 4096):
    """An offline character-level tokenizer: one id per character of ``chars`` after the specials."""
    from tokenizers import Regex, decoders, pre_tokenizers
    every_character = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")    # newlines too
    return _offline_tokenizer(list(chars), every_character, decoders.Fuse(), model_max_length)


def word_tokenizer(words: list[str], model_max_length: int = 4096):
    """An offline word-level tokenizer: one id per word of ``words`` (split at whitespace, joined by spaces)."""
    from tokenizers import pre_tokenizers
    return _offline_tokenizer(words, pre_tokenizers.WhitespaceSplit(), None, model_max_length)
