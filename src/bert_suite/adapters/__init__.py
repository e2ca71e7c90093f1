"""Task adapters: one module per task family (load, preprocess, postprocess, metrics)."""


class DataError(ValueError):
    """Input data that cannot be used; the message names the file, the record and the expectation."""


SPLIT_FILE_NAMES = {"validation": "dev", "test": "test"}


def split_file_stem(split: str) -> str:
    """validation -> dev, validation_matched -> dev_matched, test_mismatched -> test_mismatched."""
    head, _, tail = split.partition("_")
    return SPLIT_FILE_NAMES.get(head, head) + (f"_{tail}" if tail else "")


def family_options(card, defaults: dict, family: str) -> dict:
    """The card's `options` over the family's defaults; a key the family does not read is an error
    naming the card (a typo must not silently fall back to the default)."""
    unknown = sorted(set(card.options) - set(defaults))
    if unknown:
        raise ValueError(f"{card.path}: options.{unknown[0]} is not a {family} option (known: {', '.join(defaults)})")
    return {**defaults, **card.options}
