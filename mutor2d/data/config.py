"""The ``data`` section: every dataset's config variant (``data.name``), its fields and rules, and
the name of the builder of its splits (mutor2d.data.tokens: digits, code stores, photos;
mutor2d.data.stargraph). No torch here (the rule: mutor2d.config). Adding a
dataset: one DataConfig subclass here (or in a plugin) with ``@register_variant("data", NAME,
build="module:function")``."""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..checks import ConfigError, at_least, at_most, check_seed, check_workers, fail
from ..config import Variant, register_variant
from ..tokenizer.config import LEVELS_LIMIT


def digits_fingerprint(tokenizer: str = "pixel") -> dict:
    """The digits' fingerprint: scikit-learn's bundled digits.csv.gz; with a VQ checkpoint as tokenizer,
    the sha256 of both files' hashes (the tokens depend on it) and the tokenizer's own fingerprint."""
    from .. import provenance
    found = provenance.package_file("sklearn", "datasets/data/digits.csv.gz", "digits")
    if tokenizer == "pixel":
        return found
    tok = provenance.fingerprint(tokenizer)
    both = provenance.text_sha256(f"{found['sha256']}\t{tok['sha256']}")
    return {**found, "sha256": both, "tokenizer": tok}


class DataConfig(Variant):
    """A ``data`` variant: its fields and rules. Its builder takes (config, split) and returns the
    Dataset of that split ("train", "val" or "test"); a ``tokenizer`` field names what turns its
    tokens into images (mutor2d.data.tokens.build_tokenizer)."""
    num_workers: int

    def fingerprint(self) -> dict:
        """The training data's fingerprint (mutor2d.provenance): of the file or folder at ``path``, else
        the data set's name and the hash of its settings (data generated from them)."""
        from .. import provenance
        if getattr(self, "path", None):
            return provenance.fingerprint(self.path)
        fields = {k: v for k, v in self.__dict__.items() if k != "num_workers"}
        return provenance.named(self.name, provenance.text_sha256(json.dumps(fields, sort_keys=True, default=str)))


@register_variant("data", "digits", build="mutor2d.data.tokens:digits_dataset")
@dataclass
class DigitsDataConfig(DataConfig):
    """scikit-learn's bundled 8x8 digits (10 classes), split 80/20 by ``data_seed``; the 80% may give
    up a validation split ("val"), and training may use a nested share of the rest (digits_indices).
    Tokenised by ``tokenizer``: "pixel" grey levels or a VQ checkpoint (digits upsampled to its size)."""
    tokenizer: str = "pixel"         # "pixel" (grey levels) or a VQ checkpoint path
    levels: int = 17                 # pixel tokenizer: number of grey levels
    data_seed: int = 1234
    val_fraction: float = 0.0        # share of the training set held out as split "val" (0 = none)
    train_fraction: float = 1.0      # share of the remaining training images trained on (nested: 0.25 in 0.5)
    num_workers: int = 0

    def check(self) -> None:
        if not self.tokenizer:
            fail("data.tokenizer", "'pixel' or a VQ checkpoint path", self.tokenizer)
        at_least("data.levels", self.levels, 2)
        at_most("data.levels", self.levels, LEVELS_LIMIT, "an 8-bit image has no more grey levels")
        check_seed("data.data_seed", self.data_seed)
        if not 0 <= self.val_fraction < 1:
            fail("data.val_fraction", "a number in [0, 1) (0 = no validation split)", self.val_fraction)
        if not 0 < self.train_fraction <= 1:
            fail("data.train_fraction", "a number in (0, 1] (1 = all training images)", self.train_fraction)
        check_workers("data.num_workers", self.num_workers)

    def fingerprint(self) -> dict:
        return digits_fingerprint(self.tokenizer)


@register_variant("data", "codes", build="mutor2d.data.tokens:codes_dataset")
@dataclass
class CodesDataConfig(DataConfig):
    """Pre-extracted token grids: folders written by tokenizers/extract_codes.py, one per split. The
    tokenizer must be the one that made the codes (same codebook size; another sha256 is a warning);
    without the folder (sampling on another machine) that check is skipped with a warning."""
    path: str | None = None          # the train split (required)
    test_path: str | None = None     # the test split (optional)
    tokenizer: str = "pixel"         # extract_codes.py's --tokenizer that made the codes (to decode samples)
    num_workers: int = 0

    def check(self) -> None:
        if not self.path:
            fail("data.path", "the folder written by tokenizers/extract_codes.py", self.path)
        if self.test_path is not None and not self.test_path:
            fail("data.test_path", "a folder or null", self.test_path)
        check_workers("data.num_workers", self.num_workers)


@register_variant("data", "photos", build="mutor2d.data.tokens:photos_dataset")
@dataclass
class PhotosDataConfig(DataConfig):
    """Random crops of ten photographs that ship in installed packages (mutor2d.data.photos), the
    class being the photograph. Without ``path`` a split is ``num_train`` / ``num_test`` crops of
    ``image_size`` pixels generated from ``data_seed`` and tokenised in memory by ``tokenizer``
    ("pixel:LEVELS" at image_size, or a VQ checkpoint at its own size); with ``path`` (and
    ``test_path``) the split is the codes folder that tokenizers/extract_codes.py made from
    ``python -m mutor2d.data.photos export`` (``tokenizer``: the one that made it)."""
    tokenizer: str = "runs/vq_photos"  # a VQ checkpoint or run folder, or pixel:LEVELS
    path: str | None = None          # codes folder of the train split (None: generate in memory)
    test_path: str | None = None     # codes folder of the test split
    image_size: int = 32             # pixels a side of a generated crop (a VQ tokenizer uses its own)
    num_train: int = 50000
    num_test: int = 5000
    data_seed: int = 1234
    num_workers: int = 0

    def check(self) -> None:
        from .photos import COUNT_LIMIT, SIZE_LIMIT
        if not self.tokenizer:
            fail("data.tokenizer", "a VQ checkpoint (or run folder) or pixel:LEVELS", self.tokenizer)
        for key in ("path", "test_path"):
            if getattr(self, key) is not None and not getattr(self, key):
                fail(f"data.{key}", "a codes folder or null", getattr(self, key))
        at_least("data.image_size", self.image_size, 8)
        at_most("data.image_size", self.image_size, SIZE_LIMIT, "pixels a side")
        for key in ("num_train", "num_test"):
            at_least(f"data.{key}", getattr(self, key), 1)
            at_most(f"data.{key}", getattr(self, key), COUNT_LIMIT, "images held in memory")
        check_seed("data.data_seed", self.data_seed)
        check_workers("data.num_workers", self.num_workers)

    def fingerprint(self) -> dict:
        from .. import provenance
        if self.path:
            return provenance.fingerprint(self.path)
        from .photos import photos_fingerprint
        found = photos_fingerprint()
        settings = {k: getattr(self, k) for k in ("image_size", "num_train", "num_test", "data_seed")}
        tok = None if self.tokenizer.startswith("pixel") else provenance.fingerprint(self.tokenizer)
        both = provenance.text_sha256(json.dumps([found["sha256"], settings, self.tokenizer,
                                                  tok and tok["sha256"]], sort_keys=True))
        return {**found, "sha256": both, "settings": settings, "tokenizer": tok or self.tokenizer}


STARGRAPH_NODES_LIMIT = 10_000         # node ids: 8192 graphs x 10,000 draws is a 655 MB array
STARGRAPH_GRAPHS_LIMIT = 10_000_000    # graphs of a split (or of ``lm.data stargraph --count``)


@register_variant("data", "stargraph", build="mutor2d.data.stargraph:stargraph_dataset")
@dataclass
class StarGraphDataConfig(DataConfig):
    """Path-star graphs (a 1D task): ``degree`` arms of ``path_len`` nodes out of ``num_nodes``;
    test graphs use seed data_seed + 1 and never repeat a train prompt."""
    degree: int = 2
    path_len: int = 5
    num_nodes: int = 50
    num_train: int = 200000
    num_test: int = 2000
    data_seed: int = 1234            # the test split uses data_seed + 1
    reverse_answer: bool = False     # answer goal -> source (the positive control: no planning needed)
    num_workers: int = 0

    def check(self) -> None:
        at_least("data.degree", self.degree, 2)
        at_least("data.path_len", self.path_len, 2)
        need = 1 + self.degree * (self.path_len - 1)
        if self.num_nodes < need:
            raise ConfigError(f"data.num_nodes={self.num_nodes}: data.degree={self.degree} arms of "
                              f"data.path_len={self.path_len} nodes need {need} distinct nodes")
        at_most("data.num_nodes", self.num_nodes, STARGRAPH_NODES_LIMIT, "each graph draws a permutation of them")
        for key, count in (("data.num_train", self.num_train), ("data.num_test", self.num_test)):
            at_least(key, count, 1)
            at_most(key, count, STARGRAPH_GRAPHS_LIMIT, "graphs held in memory")
        check_seed("data.data_seed", self.data_seed)
        check_workers("data.num_workers", self.num_workers)
