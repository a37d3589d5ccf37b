#!/usr/bin/env python
"""PDF text through PDFium (pypdfium2, what workers.text uses) against pypdf (what it used
before): time per file and how alike the texts are, on every PDF of a folder.

    pip install pypdf   # the old extractor; overnight itself no longer depends on it
    python scripts/compare_pdf_text.py                       # ../shared/data/docs
    python scripts/compare_pdf_text.py DOCS --password SECRET --repeat 5

Both texts go through the same whitespace normalisation (workers.text.normalize). "words"
compares the word sequences (difflib ratio, 1.0 = the same words in the same order); "chars"
compares the characters, where a table read row by row or cell by cell already differs.
"""

from __future__ import annotations

import argparse
import difflib
import io
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from overnight.workers.text.core import TextOptions  # noqa: E402
from overnight.workers.text.formats import _pdf  # noqa: E402
from overnight.workers.text.normalize import normalise  # noqa: E402

DEFAULT_DOCS = REPO.parent / "shared" / "data" / "docs"


def pypdf_text(data: bytes, password: str) -> str:
    """The text as workers.text read it with pypdf, page by page."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data), strict=False)
    if reader.is_encrypted:
        reader.decrypt("") or reader.decrypt(password)
    pages = (normalise(page.extract_text() or "") for page in reader.pages)
    return normalise("\n\n".join(p for p in pages if p))


def pdfium_text(data: bytes, password: str) -> str:
    return _pdf(data, TextOptions(pdf_password=password))[0]


def best_time(fn, data: bytes, password: str, repeat: int) -> tuple[str, float]:
    best, text = float("inf"), ""
    for _ in range(repeat):
        start = time.perf_counter()
        text = fn(data, password)
        best = min(best, time.perf_counter() - start)
    return text, best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("docs", nargs="?", type=Path, default=DEFAULT_DOCS)
    # The shared encrypted sample's user password (tests/workers/text/test_text.py uses it too).
    parser.add_argument("--password", default="openpassword")
    parser.add_argument("--repeat", type=int, default=5, help="passes per file; the best counts")
    args = parser.parse_args()
    try:
        import pypdf  # noqa: F401
    except ImportError:
        parser.error("pypdf is the old extractor to compare with: pip install pypdf")
    files = sorted(args.docs.glob("*.pdf"))
    if not files:
        parser.error(f"no PDF in {args.docs}")
    _pdf(files[0].read_bytes(), TextOptions(pdf_password=args.password))  # load PDFium once
    print(f"{'file':34} {'pypdf':>9} {'pdfium':>9} {'words':>11} {'words':>6} {'chars':>6}")
    for path in files:
        data = path.read_bytes()
        old, t_old = best_time(pypdf_text, data, args.password, args.repeat)
        new, t_new = best_time(pdfium_text, data, args.password, args.repeat)
        words = difflib.SequenceMatcher(None, old.split(), new.split(), autojunk=False).ratio()
        chars = difflib.SequenceMatcher(None, old, new, autojunk=False).ratio()
        counts = f"{len(old.split())}/{len(new.split())}"
        print(
            f"{path.name:34} {t_old * 1000:7.1f}ms {t_new * 1000:7.1f}ms "
            f"{counts:>11} {words:6.3f} {chars:6.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
