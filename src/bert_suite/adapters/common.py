"""What every task adapter shares: the data error, split file names, card options, Hub loading,
reading text files, and windows over long sequences with the max-context rule (SQuAD contexts,
NER documents)."""

import numpy as np


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


def load_hub_split(card, split: str, local_files: str):
    """One split of the card's Hub dataset (or its cache) -> (dataset, source name for messages).
    Any failure, offline included, is one DataError that names the local alternative."""
    import datasets

    spec = card.splits[split]
    if not card.hub or spec.hub is None:
        raise DataError(f"{card.path}: no Hub source for split {split!r}; pass --data_dir with {local_files}")
    source = f"{card.hub['path']}" + (f" ({card.hub['name']})" if card.hub.get("name") else "") + f" split {spec.hub}"
    try:
        dataset = datasets.load_dataset(card.hub["path"], card.hub.get("name"), split=spec.hub)
    except Exception as err:  # any network/cache failure: say what to do instead
        raise DataError(f"could not load {source} from the Hub or its cache ({type(err).__name__}: "
                        f"{str(err)[:200]}); pass --data_dir with {local_files} instead") from None
    return dataset, source


def read_text(path, expected: str) -> str:
    """A data file's text (UTF-8, a BOM allowed). A missing file or bytes that are not UTF-8 are
    one DataError naming the file (and the line of the first bad byte), and what was expected."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found; expected {expected}")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line_no = raw[: err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line_no}: not valid UTF-8 ({err.reason} at byte {err.start}); expected {expected} "
                        "in UTF-8") from None


# Windows over a long sequence, shared by SQuAD (contexts) and NER (documents).
def num_windows(num_tokens, window_length: int, stride: int):
    """Number of windows over sequences of `num_tokens` sub-tokens (scalar or array): starts 0, stride,
    2*stride, ... up to the first window that reaches the last sub-token (one window for an empty sequence)."""
    if window_length < 1 or not 1 <= stride <= window_length:
        raise ValueError(f"window length {window_length} and stride {stride}: need 1 <= stride <= window length")
    excess = np.maximum(np.asarray(num_tokens, dtype=np.int64) - window_length, 0)
    return 1 + (excess + stride - 1) // stride


def window_starts(num_tokens: int, window_length: int, stride: int) -> np.ndarray:
    """Start of each window over one sequence; window k covers [k*stride, min(k*stride + window_length, n))."""
    return stride * np.arange(int(num_windows(num_tokens, window_length, stride)), dtype=np.int64)


def max_context_windows(positions, num_tokens, window_length: int, stride: int, *,
                        length_bonus: bool = False) -> np.ndarray:
    """The max-context rule: for each sub-token position (in a sequence of `num_tokens`, scalar or one per
    position), the index of the window where it has the most context, scored by min(sub-tokens left of it,
    sub-tokens right of it) within the window, ties to the first window.

    SQuAD passes `length_bonus=True`: the score gains 0.01 * the window's length, as in the reference
    implementation released with the paper, whose SQuAD predictions we reproduce (a full window can beat a
    short last one even when the short one gives a token more context on its short side). NER, which the
    reference never windowed, scores context alone: the rule as the paper states it (Section 4.3).

    Linear: a position lies in at most ceil(window_length / stride) windows, tried in turn for all
    positions at once."""
    p = np.asarray(positions, dtype=np.int64)
    total = np.broadcast_to(np.asarray(num_tokens, dtype=np.int64), p.shape)
    if p.size and ((p < 0).any() or (p >= total).any()):
        raise ValueError("positions must lie inside their sequences")
    count = num_windows(total, window_length, stride)
    low = np.maximum(0, -(-(p - window_length + 1) // stride))  # first window holding p: ceil((p-L+1)/S)
    high = np.minimum(count - 1, p // stride)  # last window holding p
    best = low.copy()
    best_score = np.full(p.shape, -1.0)
    for j in range((window_length - 1) // stride + 1):
        k = low + j
        start = k * stride
        end = np.minimum(start + window_length, total)  # exclusive
        score = np.minimum(p - start, end - 1 - p) + (0.01 * (end - start) if length_bonus else 0.0)
        better = (k <= high) & (score > best_score)
        best = np.where(better, k, best)
        best_score = np.where(better, score, best_score)
    if (best_score < 0).any():  # cannot happen: the windows cover every position
        raise AssertionError("a position lies in no window")
    return best
