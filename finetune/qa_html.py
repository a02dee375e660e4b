"""HTML to readable text with a character offset map, so that answer offsets given in the HTML move with the text.

KorQuAD 2.x gives whole Wikipedia pages as HTML (`raw_html`, and `context`: the same page with attributes stripped)
and its answers as character offsets into that HTML. A model reads text, so the page is converted to text here and
every text character remembers the HTML offset it came from; `html_span_to_text` then maps an answer's HTML span to
the text span holding the same words.

What the text looks like: whitespace collapses as a browser collapses it; block elements (paragraphs, headings,
divs, list items, table rows) start new lines; list items start with "- "; table cells of a row are joined by " | ";
`<br>` breaks the line; `<head>`, `<script>`, `<style>` and similar non-content elements are dropped; entities (&amp;,
&#39;) become the characters they stand for.
"""

from __future__ import annotations

import bisect
import html
from dataclasses import dataclass
from html.parser import HTMLParser

BLOCK_TAGS = frozenset(
    {"address", "article", "aside", "blockquote", "body", "caption", "dd", "details", "div", "dl", "dt"}
    | {"figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "html", "li"}
    | {"main", "nav", "ol", "p", "pre", "section", "summary", "table", "tbody", "td", "tfoot", "th", "thead", "tr"}
    | {"ul"}
)
# Elements whose content is not page text.
SKIPPED_TAGS = frozenset({"head", "script", "style", "noscript", "template", "svg", "math", "iframe", "object"})
CELL_TAGS = frozenset(("td", "th"))
CELL_SEPARATOR = " | "
LIST_MARKER = "- "


@dataclass
class TextWithOffsets:
    """`text` and, for each of its characters, the offset in the source HTML of the character or tag it came from."""

    text: str
    source_offsets: list[int]

    def span_to_text(self, source_start: int, source_end: int) -> tuple[int, int] | None:
        """The text span [start, end) of the characters that came from source[source_start:source_end], without
        surrounding whitespace; None when no text came from there (e.g. the span covers only tags)."""
        # source_offsets never decrease: the parser reads the source left to right.
        start = bisect.bisect_left(self.source_offsets, source_start)
        end = bisect.bisect_left(self.source_offsets, source_end)
        while start < end and self.text[start].isspace():
            start += 1
        while end > start and self.text[end - 1].isspace():
            end -= 1
        return (start, end) if start < end else None


class _TextBuilder:
    """Appends text with source offsets, collapsing whitespace as HTML rendering does."""

    def __init__(self):
        self.chars: list[str] = []
        self.offsets: list[int] = []

    def _last(self) -> str:
        return self.chars[-1] if self.chars else "\n"

    def add_text(self, text: str, offset: int, offsets: list[int] | None = None) -> None:
        """Add `text` whose character i came from `offsets[i]` (default: offset + i), whitespace collapsed."""
        for i, ch in enumerate(text):
            source = offsets[i] if offsets is not None else offset + i
            if ch.isspace():
                if not self._last().isspace():
                    self.chars.append(" ")
                    self.offsets.append(source)
            else:
                self.chars.append(ch)
                self.offsets.append(source)

    def add_separator(self, separator: str, offset: int) -> None:
        """Add markup-made text (a line break, a cell separator, a list marker), all of it mapped to its tag."""
        if separator == "\n":
            while self.chars and self.chars[-1] == " ":  # no trailing spaces before a line break
                self.chars.pop()
                self.offsets.pop()
            if self._last() == "\n":
                return
        elif self._last() == " " and separator.startswith(" "):
            separator = separator[1:]
        self.chars.extend(separator)
        self.offsets.extend([offset] * len(separator))

    def result(self) -> TextWithOffsets:
        while self.chars and self.chars[-1].isspace():
            self.chars.pop()
            self.offsets.pop()
        return TextWithOffsets("".join(self.chars), self.offsets)


class _HTMLToText(HTMLParser):
    def __init__(self, source: str):
        # convert_charrefs=False: text arrives as the source's raw characters, so each one's offset is known;
        # entities arrive separately and are decoded here.
        super().__init__(convert_charrefs=False)
        self.source = source
        self.line_starts = [0]
        for i, ch in enumerate(source):
            if ch == "\n":
                self.line_starts.append(i + 1)
        self.builder = _TextBuilder()
        self.skip_depth = 0
        self.cells_in_row: list[int] = []  # one counter per open table row (tables nest)

    def _offset(self) -> int:
        line, column = self.getpos()
        return self.line_starts[line - 1] + column

    def handle_starttag(self, tag, attrs):
        if tag in SKIPPED_TAGS:
            self.skip_depth += 1
            return
        if self.skip_depth:
            return
        offset = self._offset()
        if tag == "tr":
            self.cells_in_row.append(0)
        if tag in CELL_TAGS and self.cells_in_row:
            if self.cells_in_row[-1]:
                self.builder.add_separator(CELL_SEPARATOR, offset)
            self.cells_in_row[-1] += 1
            return  # cells of a row stay on one line
        if tag in BLOCK_TAGS or tag == "br":
            self.builder.add_separator("\n", offset)
        if tag == "li":
            self.builder.add_separator(LIST_MARKER, offset)

    def handle_endtag(self, tag):
        if tag in SKIPPED_TAGS:
            self.skip_depth = max(self.skip_depth - 1, 0)
            return
        if self.skip_depth:
            return
        if tag == "tr" and self.cells_in_row:
            self.cells_in_row.pop()
        if tag in BLOCK_TAGS and tag not in CELL_TAGS:
            self.builder.add_separator("\n", self._offset())

    def handle_data(self, data):
        if not self.skip_depth:
            self.builder.add_text(data, self._offset())

    def _add_reference(self, decoded: str):
        if not self.skip_depth:
            self.builder.add_text(decoded, 0, [self._offset()] * len(decoded))

    def handle_entityref(self, name):
        self._add_reference(html.unescape(f"&{name};"))

    def handle_charref(self, name):
        self._add_reference(html.unescape(f"&#{name};"))


def html_to_text(source: str) -> TextWithOffsets:
    """Readable text of an HTML page (or fragment) and the source offset of each of its characters."""
    parser = _HTMLToText(source)
    parser.feed(source)
    parser.close()
    return parser.builder.result()


def fragment_text(fragment: str) -> str:
    """The text of an HTML fragment (e.g. an answer given as '<a>신중현</a>') as `html_to_text` renders it."""
    return html_to_text(fragment).text.strip()


__all__ = ["TextWithOffsets", "fragment_text", "html_to_text"]
