"""The values of a sample request that need no model: its error, class lists and the per-class limit.
No torch, so that sample.py checks its flags before importing torch."""
from __future__ import annotations

PER_CLASS_LIMIT = 1024      # sample.per_class / sample.py --per-class: the columns of a grid


class SampleFileError(ValueError):
    """Bad sample request or inconsistent shard folder; one-line message."""


def check_classes(classes, num_choices: int, name: str = "--classes") -> list[int]:
    """Each index in 0..num_choices-1 (the conditioning kind's choices: the classes for class labels),
    else a one-line error naming ``name``."""
    if bad := [c for c in classes if not 0 <= c < num_choices]:
        raise SampleFileError(f"{name} {','.join(map(str, classes))!r}: class {bad[0]} is out of range "
                              f"0..{num_choices - 1}")
    return list(classes)


def parse_classes(text: str, num_choices: int) -> list[int]:
    """"1,7,9" -> [1, 7, 9], each in 0..num_choices-1."""
    out = []
    for item in text.split(","):
        try:
            out.append(int(item.strip()))
        except ValueError:
            raise SampleFileError(f"--classes {text!r}: {item.strip()!r} is not a class index "
                                  f"(expected comma-separated integers in 0..{num_choices - 1})") from None
    return check_classes(out, num_choices)
