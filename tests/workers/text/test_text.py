"""Specifications for workers.text: bytes in, one TextResult out, for every input."""

from __future__ import annotations

import io
import json
import os
import random
import time
import zipfile
from pathlib import Path

import pytest

from overnight.schemas.errors import ERROR_CODES
from overnight.workers.text import KINDS, InvalidTextOptions, TextOptions, TextResult, extract_text
from overnight.workers.text import sandbox as text_module

DOCS = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "docs"


def shared_doc(name: str) -> bytes:
    path = DOCS / name
    if not path.is_file():
        pytest.skip(f"shared document {name} is not available")
    return path.read_bytes()


def assert_ok(result: TextResult, kind: str) -> str:
    assert result.error_code is None, result.error_message
    assert result.error_message is None
    assert result.kind == kind
    assert result.text
    return result.text


def assert_error(result: TextResult, code: str) -> None:
    assert result.error_code == code, (result.error_code, result.error_message, result.text)
    assert result.text is None
    assert result.error_message
    assert result.kind in KINDS


# ---- generated inputs


def make_pdf(*page_contents: bytes, image: bool = False) -> bytes:
    """A hand-written PDF: one page per content stream, Helvetica as /F1, a 1x1 image /Im1."""
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"",  # the page tree, filled in once the page numbers are known
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace /DeviceGray "
        b"/BitsPerComponent 8 /Length 1 >>\nstream\n\x80\nendstream",
    ]
    resources = b"<< /Font << /F1 3 0 R >> /XObject << /Im1 4 0 R >> >>"
    kids = []
    for content in page_contents:
        if image:
            content = b"q 200 0 0 200 100 400 cm /Im1 Do Q\n" + content
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources %s "
            b"/Contents %d 0 R >>" % (resources, len(objects))
        )
        kids.append(b"%d 0 R" % len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), len(kids))
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def text_page(*lines: str) -> bytes:
    ops = [b"BT /F1 12 Tf 72 720 Td 14 TL"]
    ops += [b"(%s) Tj T*" % line.encode("latin-1") for line in lines]
    ops.append(b"ET")
    return b"\n".join(ops)


def make_docx() -> bytes:
    docx = pytest.importorskip("docx")
    document = docx.Document()
    document.add_heading("Quarterly review", level=1)
    document.add_paragraph("Revenue grew   by 12 percent.")
    document.add_paragraph("")
    document.add_paragraph("Churn fell.")
    table = document.add_table(rows=2, cols=2)
    for row, cells in zip(table.rows, (("Region", "Sales"), ("North", "42")), strict=True):
        for cell, value in zip(row.cells, cells, strict=True):
            cell.text = value
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def binary_junk() -> bytes:
    rng = random.Random(7)
    return bytes(rng.randrange(256) for _ in range(4096))


# ---- PDF


def test_text_pdf_is_extracted_with_page_count():
    result = extract_text(shared_doc("minimal-document.pdf"), "minimal-document.pdf")
    text = assert_ok(result, "pdf")
    assert result.pages == 1
    assert text.startswith("Lorem ipsum dolor sit amet")
    assert result.seconds > 0


def test_multi_page_pdf_joins_pages_with_blank_lines():
    result = extract_text(shared_doc("pdflatex-4-pages.pdf"), "pdflatex-4-pages.pdf")
    text = assert_ok(result, "pdf")
    assert result.pages == 4
    assert text.count("\n\n") >= 3
    assert "Hello, here is some text without a meaning" in text
    assert "  " not in text


def test_google_docs_pdf_is_extracted():
    text = assert_ok(extract_text(shared_doc("google-doc-document.pdf"), "doc.pdf"), "pdf")
    assert "Beautiful is better than ugly." in text


def test_encrypted_pdf_becomes_encrypted_error_without_password():
    result = extract_text(shared_doc("libreoffice-writer-password.pdf"), "secret.pdf")
    assert_error(result, "encrypted")
    assert result.kind == "pdf"
    assert "pdf_password" in (result.error_message or "")


def test_encrypted_pdf_opens_with_the_configured_password():
    data = shared_doc("libreoffice-writer-password.pdf")
    result = extract_text(data, "secret.pdf", TextOptions(pdf_password="openpassword"))
    assert assert_ok(result, "pdf").startswith("Lorem ipsum")
    assert result.pages == 1


def test_wrong_pdf_password_is_encrypted_error_that_does_not_reveal_the_password():
    data = shared_doc("libreoffice-writer-password.pdf")
    result = extract_text(data, "secret.pdf", TextOptions(pdf_password="hunter2-guess"))
    assert_error(result, "encrypted")
    assert "hunter2-guess" not in (result.error_message or "")


def test_hand_written_pdf_text_is_extracted_page_by_page():
    data = make_pdf(text_page("Invoice   number 42", "Total due: 10 EUR"), text_page("Page two"))
    result = extract_text(data, "generated.pdf")
    assert assert_ok(result, "pdf") == "Invoice number 42\nTotal due: 10 EUR\n\nPage two"
    assert result.pages == 2


def test_pdf_magic_wins_over_a_misleading_extension():
    data = make_pdf(text_page("Hello from a PDF"))
    assert assert_ok(extract_text(data, "notes.txt"), "pdf") == "Hello from a PDF"


def test_pdf_of_images_only_becomes_no_text():
    result = extract_text(make_pdf(b"", b"", image=True), "scan.pdf")
    assert_error(result, "no_text")
    assert result.kind == "pdf"
    assert result.pages == 2


def _pdfium_empty_document() -> bytes:
    import pypdfium2 as pdfium

    buffer = io.BytesIO()
    pdfium.PdfDocument.new().save(buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "make", [_pdfium_empty_document, make_pdf], ids=["written-by-pdfium", "hand-written"]
)
def test_pdf_without_pages_becomes_no_text_saying_it_has_no_pages(make):
    # It was corrupt_document, "unreadable PDF: Failed to load document (PDFium: Success)",
    # and after another PDF's load error in the same extractor process that PDF's code.
    assert_error(extract_text(b"%PDF-1.7\n" + binary_junk(), "broken.pdf"), "corrupt_document")
    for _ in range(2):  # the same reason after its own failed load
        result = extract_text(make(), "empty.pdf")
        assert_error(result, "no_text")
        assert result.kind == "pdf" and result.pages == 0
        assert result.error_message == "the PDF has no pages: there is no text to read"


def test_garbage_after_pdf_header_becomes_corrupt_document():
    result = extract_text(b"%PDF-1.7\n" + binary_junk(), "broken.pdf")
    assert_error(result, "corrupt_document")
    assert result.kind == "pdf"


def test_truncated_pdf_becomes_corrupt_document():
    data = shared_doc("minimal-document.pdf")
    assert_error(extract_text(data[: len(data) // 2], "truncated.pdf"), "corrupt_document")


def test_pdf_longer_than_max_chars_becomes_too_large():
    data = make_pdf(text_page("a" * 60), text_page("b" * 60))
    assert_error(extract_text(data, "long.pdf", TextOptions(max_chars=50)), "too_large")


# ---- HTML, DOCX, JSON


def test_html_drops_script_style_and_head_and_keeps_block_breaks():
    html = (
        b"<!DOCTYPE html><html><head><title>Ignored title</title>"
        b"<style>p { color: red }</style></head><body>"
        b"<h1>Call   notes</h1><script>var secret = 'not text';</script>"
        b"<p>Fish &amp; chips, caf&eacute;&nbsp;au lait.\n  Same paragraph.</p>"
        b"<ul><li>first</li><li>second</li></ul><p>Line<br>break</p></body></html>"
    )
    result = extract_text(html, "page.html")
    assert assert_ok(result, "html") == (
        "Call notes\n\nFish & chips, café au lait. Same paragraph.\n\nfirst\nsecond\n\nLine\nbreak"
    )


def test_html_without_extension_is_sniffed():
    result = extract_text(b"  <html><body><p>Hi there</p></body></html>", "object-123")
    assert assert_ok(result, "html") == "Hi there"


def test_html_meta_charset_is_honoured():
    html = '<html><head><meta charset="windows-1252"></head><body>“Hi” – €5</body></html>'
    result = extract_text(html.encode("cp1252"), "legacy.htm")
    assert assert_ok(result, "html") == "“Hi” – €5"


def test_docx_paragraphs_and_tables_are_extracted_in_order():
    result = extract_text(make_docx(), "review.docx")
    assert assert_ok(result, "docx") == (
        "Quarterly review\n\nRevenue grew by 12 percent.\n\nChurn fell.\n\nRegion | Sales\nNorth | 42"
    )
    assert result.pages is None


def test_docx_is_detected_by_content_without_extension():
    assert_ok(extract_text(make_docx(), "upload"), "docx")


def test_zip_that_is_not_docx_becomes_unsupported_type():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("xl/workbook.xml", "<workbook/>")
    assert_error(extract_text(buffer.getvalue(), "sheet.xlsx"), "unsupported_type")


def test_docx_extension_on_non_zip_bytes_becomes_corrupt_document():
    result = extract_text(b"this is not a zip", "report.docx")
    assert_error(result, "corrupt_document")
    assert result.kind == "docx"


def test_json_object_text_field_is_extracted():
    data = json.dumps({"id": 1, "text": "Hello   world.\n\n\n\nBye."}).encode()
    assert assert_ok(extract_text(data, "item.json"), "json") == "Hello world.\n\nBye."


def test_json_list_of_records_is_joined_and_records_without_the_field_skipped():
    data = json.dumps([{"text": "one"}, {"other": "x"}, {"text": "two"}, 3]).encode()
    assert assert_ok(extract_text(data, "items.json"), "json") == "one\n\ntwo"


def test_jsonl_records_are_joined_using_the_configured_field():
    data = b'{"body": "first record"}\n\n{"body": "second record"}\n'
    result = extract_text(data, "calls.jsonl", TextOptions(json_text_field="body"))
    assert assert_ok(result, "jsonl") == "first record\n\nsecond record"


def test_json_without_the_text_field_becomes_no_text():
    result = extract_text(b'{"transcript": "hello"}', "item.json")
    assert_error(result, "no_text")
    assert "'text'" in (result.error_message or "")


def test_invalid_json_and_jsonl_become_corrupt_document():
    assert_error(extract_text(b'{"text": "unterminated', "item.json"), "corrupt_document")
    result = extract_text(b'{"text": "ok"}\nnot json\n', "items.jsonl")
    assert_error(result, "corrupt_document")
    assert "line 2" in (result.error_message or "")


# ---- plain text and encodings


def test_utf8_text_with_bom_is_decoded_and_whitespace_normalised():
    data = "\ufeffHello   wörld\t\tagain  \r\n\r\n\r\n\r\nNext paragraph\n".encode()
    assert assert_ok(extract_text(data, "a.txt"), "text") == "Hello wörld again\n\nNext paragraph"


def test_markdown_keeps_indentation_and_paragraphs():
    data = b"# Title\n\n- item\n    - nested   item\n\n    code  block\n"
    result = extract_text(data, "README.md")
    assert assert_ok(result, "markdown") == "# Title\n\n- item\n    - nested item\n\n    code block"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_text_is_decoded_with_or_without_bom(encoding):
    data = "Grüße aus Köln.\nZweite Zeile.\n".encode(encoding)
    assert assert_ok(extract_text(data, "letter.txt"), "text") == "Grüße aus Köln.\nZweite Zeile."


def test_latin1_text_is_decoded():
    expected = "Café crème brûlée, déjà vu. Über naïve façade."
    assert assert_ok(extract_text(expected.encode("latin-1"), "menu.txt"), "text") == expected


def test_cyrillic_legacy_text_is_decoded():
    expected = "Привет, мир! Это тестовый текст на русском языке."
    assert assert_ok(extract_text(expected.encode("cp1251"), "ru.txt"), "text") == expected


def test_unknown_extension_with_text_is_read_as_text():
    assert assert_ok(extract_text(b"id,name\n1,Ada\n", "people.csv"), "text") == "id,name\n1,Ada"


def test_invalid_utf8_junk_becomes_invalid_encoding():
    rng = random.Random(3)
    data = bytes(rng.randrange(0x80, 0x100) for _ in range(600))
    result = extract_text(data, "mystery.txt")
    assert_error(result, "invalid_encoding")
    assert result.kind == "text"


@pytest.mark.parametrize("name", ["blob.bin", "notes.txt", "noextension"])
def test_binary_junk_becomes_unsupported_type(name):
    result = extract_text(binary_junk(), name)
    assert_error(result, "unsupported_type")
    assert result.kind == "unknown"


def test_known_binary_formats_become_unsupported_type():
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(32)
    result = extract_text(png, "photo.png")
    assert_error(result, "unsupported_type")
    assert "PNG" in (result.error_message or "")


def test_empty_file_becomes_empty_file():
    result = extract_text(b"", "empty.pdf")
    assert_error(result, "empty_file")
    assert result.kind == "pdf"


@pytest.mark.parametrize("name", ["blank.txt", "blank.md", "blank.html", "blank"])
def test_whitespace_only_text_becomes_no_text(name):
    assert_error(extract_text(b" \n\t\r\n  \xc2\xa0 \n", name), "no_text")


def test_text_longer_than_max_chars_becomes_too_large():
    result = extract_text(b"word " * 100, "long.txt", TextOptions(max_chars=100))
    assert_error(result, "too_large")
    assert "max_chars=100" in (result.error_message or "")


@pytest.mark.parametrize("name", ["x.pdf", "x.docx", "x.html", "x.json", "x.jsonl", "x.md", "x"])
def test_every_bad_input_returns_a_result_with_a_documented_code(name):
    rng = random.Random(name)
    inputs = [
        b"%PDF-",
        b"PK\x03\x04" + bytes(rng.randrange(256) for _ in range(64)),
        b"\x00",
        b"[" * 100_000,
        b"\xff\xfe\x00",
    ]
    for data in inputs:
        result = extract_text(data, name)
        assert isinstance(result, TextResult)
        assert result.kind in KINDS
        assert (result.text is None) == (result.error_code is not None)
        assert result.error_code is None or result.error_code in ERROR_CODES


# ---- time limit and the extractor process


def test_document_over_the_time_limit_becomes_extract_timeout_and_the_next_one_works():
    extract_text(b"warm up", "a.txt")
    stalled_pid = text_module._SANDBOX.pid
    request = text_module._Request(
        data=b"slow", name="slow.pdf", options=TextOptions(timeout_s=0.3), stall_s=60
    )
    started = time.perf_counter()
    result = text_module._run(request)
    assert_error(result, "extract_timeout")
    assert result.kind == "pdf"
    assert 0.3 <= result.seconds < 10
    assert time.perf_counter() - started < 10
    assert stalled_pid is not None and not _alive(stalled_pid)
    assert assert_ok(extract_text(b"after the timeout", "b.txt"), "text") == "after the timeout"


def test_extractor_crash_becomes_an_error_row_and_the_next_document_works():
    request = text_module._Request(data=b"boom", name="boom.txt", options=TextOptions(), crash=True)
    result = text_module._run(request)
    assert_error(result, "corrupt_document")
    assert "died" in (result.error_message or "")
    assert assert_ok(extract_text(b"still alive", "c.txt"), "text") == "still alive"


def test_extractor_process_is_reused_between_documents():
    extract_text(b"one", "a.txt")
    starts, pid = text_module._SANDBOX.starts, text_module._SANDBOX.pid
    for _ in range(20):
        extract_text(b"again", "a.txt")
    assert (text_module._SANDBOX.starts, text_module._SANDBOX.pid) == (starts, pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- options


def test_options_repr_never_shows_the_pdf_password():
    assert "openpassword" not in repr(TextOptions(pdf_password="openpassword"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout_s", 0), ("timeout_s", float("nan")), ("max_chars", 0), ("json_text_field", "")],
)
def test_invalid_options_are_rejected_naming_the_field(field, value):
    with pytest.raises(InvalidTextOptions, match=field):
        TextOptions(**{field: value})


_W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def streamed_docx(paragraph: bytes, count: int) -> bytes:
    """A DOCX whose body repeats ``paragraph`` ``count`` times, written in pieces: a few MB
    compressed, however large the XML it expands to."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w", force_zip64=True) as part:
            part.write(f'<w:document xmlns:w="{_W_NS}"><w:body>'.encode())
            block = paragraph * 4096
            for _ in range(count // 4096):
                part.write(block)
            part.write(b"</w:body></w:document>")
    return buffer.getvalue()


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_a_docx_whose_text_would_be_a_gib_is_too_large_before_the_text_is_built():
    words = b"<w:p><w:r><w:t>" + b"call centre notes " * 56 + b"</w:t></w:r></w:p>"  # 1 KiB
    bomb = streamed_docx(words, 2**20)  # 1 GiB of text
    assert len(bomb) < 16 * 2**20
    result = extract_text(bomb, "bomb.docx")
    assert_error(result, "too_large")
    assert "max_chars=2000000" in result.error_message
    assert _peak_rss_mb(text_module._SANDBOX.pid) < 1024  # the whole text was never held


def test_the_extractor_child_gets_too_large_at_its_memory_cap_instead_of_exhausting_the_node():
    # Little text, a lot of markup: 400 MB of XML from a zip of a few hundred KB.
    markup = b'<w:p w:rsidR="' + b"0" * 1000 + b'"/>'
    bomb = streamed_docx(markup, 400_000)
    assert len(bomb) < 4 * 2**20
    text_module._SANDBOX.close()  # a fresh child: its peak memory is this document's alone
    options = TextOptions(max_memory_mb=256)
    result = extract_text(bomb, "paragraphs.docx", options)
    assert_error(result, "too_large")
    assert "max_memory_mb=256" in result.error_message
    assert _peak_rss_mb(text_module._SANDBOX.pid) < 256 + 300  # the cap plus the idle child
    # The child lives on, and the next document reads as usual.
    assert_ok(extract_text(make_docx(), "next.docx", options), "docx")
