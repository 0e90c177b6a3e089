"""Python source code corpus from the local CPython standard library.

What: lists the stdlib ``*.py`` files of the running interpreter, splits them
deterministically into train / held-out by a hash of the relative path, and
yields them as ~2000-character chunks cut at line boundaries.

Why: nothing may be downloaded here, yet the tiny model should see real,
open-ended text (the paper's "open-ended" regime, where parallel decoding
gains least) and code-completion SFT records. The stdlib is ~10 MB of real
Python that is always present. Test suites, IDLE, codec tables and files over
200 KB are skipped: they are large, repetitive or not representative.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HELDOUT_PERCENT = 3
MAX_FILE_BYTES = 200_000
CHUNK_CHARS = 2000
SKIP_DIR_NAMES = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages",
                            "__pycache__", "encodings", "turtledemo"})


@dataclass(frozen=True, slots=True)
class CodeChunk:
    """One document: ``text`` is chunk ``index`` of the stdlib file ``path`` (relative)."""

    path: str
    index: int
    text: str


def stdlib_root() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel_path: str) -> str:
    """Return "heldout" for ~3% of relative paths (by a stable hash), else "train"."""
    digest = hashlib.blake2b(rel_path.encode("utf-8"), digest_size=8).digest()
    return "heldout" if int.from_bytes(digest, "big") % 100 < HELDOUT_PERCENT else "train"


def _skipped(rel: Path) -> bool:
    parts = rel.parts[:-1]
    return (any(p in SKIP_DIR_NAMES or p.startswith("config-") for p in parts)
            or rel.name.startswith("_sysconfigdata"))


def stdlib_files(split: str, root: Path | None = None) -> list[Path]:
    """Sorted stdlib ``*.py`` files of ``split`` ("train", "heldout" or "all").

    Raises:
        ValueError: unknown split.
    """
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    root = root or stdlib_root()
    files = []
    for path in _walk_py(root):
        rel = path.relative_to(root)
        if _skipped(rel) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        if split == "all" or split_of(rel.as_posix()) == split:
            files.append(path)
    return sorted(files)


def _walk_py(root: Path) -> Iterator[Path]:
    """All regular ``*.py`` files under ``root``, never descending into skipped dirs."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIR_NAMES and not d.startswith("config-")]
        for name in filenames:
            path = Path(dirpath, name)
            if name.endswith(".py") and path.is_file():
                yield path


def chunk_lines(text: str, chunk_chars: int = CHUNK_CHARS) -> list[str]:
    """Cut ``text`` into pieces of about ``chunk_chars`` characters at line ends.

    A piece closes as soon as it reaches ``chunk_chars``; a single longer line
    stays whole. Whitespace-only pieces are dropped. Joining the pieces
    (before dropping) gives back ``text``.
    """
    pieces, current, size = [], [], 0
    for line in text.splitlines(keepends=True):
        current.append(line)
        size += len(line)
        if size >= chunk_chars:
            pieces.append("".join(current))
            current, size = [], 0
    if current:
        pieces.append("".join(current))
    return [p for p in pieces if p.strip()]


def code_chunks(split: str, root: Path | None = None) -> Iterator[CodeChunk]:
    """Yield ``CodeChunk`` documents of ``split`` in a fixed order; undecodable files are skipped."""
    root = root or stdlib_root()
    for path in stdlib_files(split, root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = path.relative_to(root).as_posix()
        for i, piece in enumerate(chunk_lines(text)):
            yield CodeChunk(rel, i, piece)


def code_documents(split: str, max_chars: int | None = None) -> Iterator[str]:
    """Yield chunk texts of ``split``, stopping once ``max_chars`` characters were yielded."""
    total = 0
    for chunk in code_chunks(split):
        if max_chars is not None and total >= max_chars:
            return
        total += len(chunk.text)
        yield chunk.text
