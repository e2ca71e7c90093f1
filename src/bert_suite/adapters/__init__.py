"""Task adapters: one module per task family (load, preprocess, postprocess, metrics)."""


class DataError(ValueError):
    """Input data that cannot be used; the message names the file, the record and the expectation."""


SPLIT_FILE_NAMES = {"validation": "dev", "test": "test"}


def split_file_stem(split: str) -> str:
    """validation -> dev, validation_matched -> dev_matched, test_mismatched -> test_mismatched."""
    head, _, tail = split.partition("_")
    return SPLIT_FILE_NAMES.get(head, head) + (f"_{tail}" if tail else "")
