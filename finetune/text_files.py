"""Reading the user's text files, for every script's data reader: one `--encoding`, byte-order marks, and one line
naming the file, the line and the encoding to pass when the bytes are not in the expected one.

    text = read_text(path, encoding)                    # the whole file, decoded
    for line in open_text(path, encoding): ...          # the same as a text stream (newline="": csv's way)
    head = read_head(path, encoding)                    # the first MiB, checked (corpora too large to read twice)
    codec = file_codec(path, encoding)                  # what to hand another reader (datasets' builders)

`encoding` is the scripts' --encoding: None means UTF-8. A byte-order mark at the start of a file names its encoding
(UTF-8, UTF-16 or UTF-32) whatever --encoding says, and is dropped: spreadsheet programs write one on "Save as
UTF-8", and without this the first column's name would start with an invisible U+FEFF. Bytes that do not decode
raise a DataError such as

    train.tsv, line 2: not UTF-8 text (byte 0xd4 does not decode); it reads as gb18030 (Chinese): pass
    --encoding gb18030

The suggestion is charset_normalizer's guess from the file's first lines; nothing is read with a guessed encoding:
a wrong guess would read garbage without a word.
"""

from __future__ import annotations

import codecs
import io
from pathlib import Path

from .errors import ArgumentError, DataError

DEFAULT_ENCODING = "utf-8"
HEAD_BYTES = 1 << 20  # how much of a corpus file read_head decodes (and guesses from)

# Byte-order marks, longest first (UTF-32 LE's begins with UTF-16 LE's).
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def check_encoding(encoding: str | None) -> str:
    """--encoding as given -> the codec to read with; UTF-8 reads as utf-8-sig (a byte-order mark is dropped)."""
    name = encoding or DEFAULT_ENCODING
    try:
        codec = codecs.lookup(name).name
    except LookupError:
        raise ArgumentError(f"--encoding {name}: unknown encoding (e.g. utf-8, gb18030, big5, cp1252)") from None
    return "utf-8-sig" if codec == "utf-8" else codec


def codec_of(data: bytes, encoding: str | None) -> str:
    """The codec for a file that begins with `data`: its byte-order mark's, else --encoding's."""
    for bom, codec in BOMS:
        if data.startswith(bom):
            return codec
    return check_encoding(encoding)


def file_codec(path, encoding: str | None) -> str:
    """The codec to read `path` with (see codec_of), for readers that decode the file themselves."""
    with open(path, "rb") as file:
        return codec_of(file.read(4), encoding)


def read_text(path, encoding: str | None = None) -> str:
    """The whole file, decoded; DataError (file, line, the encoding to pass) where it does not decode."""
    data = Path(path).read_bytes()
    codec = codec_of(data, encoding)
    try:
        return data.decode(codec)
    except UnicodeDecodeError as error:
        raise decode_error(path, data, codec, error) from None


def open_text(path, encoding: str | None = None) -> io.StringIO:
    """`read_text` as a stream of lines, newlines as written (csv.reader's newline="")."""
    return io.StringIO(read_text(path, encoding), newline="")


def read_head(path, encoding: str | None = None, size: int = HEAD_BYTES) -> str:
    """The first `size` bytes of the file, decoded (a character cut at the end is left out); DataError as read_text.
    For corpora read by another reader afterwards: a file in another encoding stops the run before any work."""
    with open(path, "rb") as file:
        data = file.read(size)
        whole = not file.read(1)
    codec = codec_of(data, encoding)
    try:
        return codecs.getincrementaldecoder(codec)().decode(data, final=whole)
    except UnicodeDecodeError as error:
        raise decode_error(path, data, codec, error) from None


def decode_error(path, data: bytes, codec: str, error: UnicodeDecodeError) -> DataError:
    """One line: the file, the line of the first byte that does not decode, and the encoding to pass."""
    line = data.count(b"\n", 0, error.start) + 1
    byte = data[error.start : error.start + 1].hex()
    what = f"not {codec_name(codec)} text (byte 0x{byte} does not decode)"
    return DataError(f"{what}; {suggestion(data, error.start)}", path=path, row=line)


def codec_name(codec: str) -> str:
    """How messages name a codec: UTF-8 for utf-8-sig (the byte-order mark is an implementation detail here)."""
    return "UTF-8" if codec in ("utf-8", "utf-8-sig") else codec


def suggestion(data: bytes, start: int) -> str:
    """What to pass: the encoding charset_normalizer finds for the file's first lines (up to the one with the byte
    at `start` that did not decode, at least), or a few to try."""
    hint = "pass the file's encoding with --encoding (e.g. gb18030, big5, shift_jis, euc-kr, cp1252)"
    try:
        import charset_normalizer  # with requests, which datasets and evaluate use
    except ImportError:
        return hint
    head = data[: max(HEAD_BYTES, start + 1)]
    end = head.rfind(b"\n")
    head = head[: end + 1] if end >= start else head  # whole lines: a character cut in two decodes in no encoding
    found = charset_normalizer.from_bytes(head).best()
    if found is None:
        return hint
    codec = codecs.lookup(found.encoding).name
    language = f" ({found.language})" if found.language and found.language != "Unknown" else ""
    return f"it reads as {codec}{language}: pass --encoding {codec}"
