"""Nothing a student wrote runs in the instructor's browser (issue 25).

The Formgrader and the feedback render each graded copy with nbconvert's HTML templates. The
Formgrader's page has the Jupyter server's origin, and JupyterLab shows it in a frame that allows
scripts and same-origin requests (@jupyter/nbgrader 0.9.6 hard-codes the iframe's sandbox as
``allow-scripts allow-same-origin allow-forms``, which the Formgrader's own page needs, and offers
no setting to narrow it). A script there can do all the instructor can: write files through
/api/contents, open a terminal, post grades to /formgrader/api. nbgrader's formgrade and feedback
templates put a markdown cell in as ``cell.source | markdown2html``, without nbconvert's
``clean_html``, so nbconvert's ``sanitize_html`` setting would not reach them. The graded copy
itself is therefore made inert, and what was removed is a finding:

- ``SanitizeMarkdown`` (the sanitising pass, before the notebook runs): a markdown or raw cell
  whose HTML, as nbconvert renders it, holds anything outside ``ALLOWED_TAGS`` and
  ``ALLOWED_ATTRIBUTES``, a URL that is not a plain link or image, or any markup the parser cannot
  read, is shown as text: a code block of what the student wrote. Attachments: only images, capped
  per cell and per notebook; a reference to a missing one gets an empty image (nbconvert stops at
  a missing attachment).
- ``SanitizeOutputs`` (after the run): ``application/javascript`` outputs are dropped, and so is an
  HTML, SVG or Markdown output that fails the same test (its text/plain stays). Widget views and
  the widget state go without a finding: a graded copy cannot show a live widget, and the state
  names JavaScript modules for the browser to load.

``markdown_text`` escapes a string (a file name, a cell id) for a Markdown cell the grader writes.
"""
from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser

import nbformat
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer

# What rendered Markdown and the course's own outputs use; every other element (script, style,
# iframe, object, embed, form, svg, math, template, base, meta, link, ...) counts as unsafe.
ALLOWED_TAGS = frozenset(
    "a abbr b blockquote br caption center cite code col colgroup dd del details div dl dt em "
    "figcaption figure font h1 h2 h3 h4 h5 h6 hr i img ins kbd li mark ol p pre q s samp small span "
    "strike strong sub summary sup table tbody td tfoot th thead tr tt u ul var wbr".split())
GLOBAL_ATTRIBUTES = frozenset("class id title style align dir lang".split())
ALLOWED_ATTRIBUTES = {
    "a": {"href", "name", "rel", "target"}, "img": {"src", "alt", "width", "height"},
    "td": {"colspan", "rowspan"}, "th": {"colspan", "rowspan", "scope"}, "ol": {"start", "type"},
    "col": {"span"}, "colgroup": {"span"}, "font": {"color", "size"}, "details": {"open"},
    "code": {"data-lang"},
}
LINK_SCHEMES = ("http:", "https:", "mailto:")
# In a style: anything that loads a URL or is not plain CSS.
UNSAFE_STYLE = re.compile(r"url\s*\(|expression|@import|javascript:|\\|<|&", re.I)
IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp")
EMPTY_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=")


class _Inspector(HTMLParser):
    """Everything in an HTML fragment that is not on the allow-list, in words."""

    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.unsafe: list[str] = []

    def unsafe_found(self, what: str) -> None:
        self.unsafe.append(what)

    def handle_starttag(self, tag, attrs):
        if tag not in ALLOWED_TAGS:
            self.unsafe.append(f"a <{tag}> element")
            return
        for name, value in attrs:
            value = value or ""
            if name not in GLOBAL_ATTRIBUTES and name not in ALLOWED_ATTRIBUTES.get(tag, ()):
                self.unsafe.append(f"an attribute {name!r} on <{tag}>")
            elif name == "style" and UNSAFE_STYLE.search(value):
                self.unsafe.append("a style that loads or runs something")
            elif name in ("href", "src") and not _safe_url(value, image=name == "src"):
                self.unsafe.append(f"a {name} of {value[:40]!r}")

    handle_startendtag = handle_starttag

    def handle_data(self, data):
        if re.search(r"<[A-Za-z!/?]", data):          # markup the parser could not read as a tag
            self.unsafe.append("markup that cannot be read safely")

    def handle_comment(self, data):
        self.unsafe.append("an HTML comment")         # browsers and parsers end them differently

    def handle_decl(self, decl):
        self.unsafe.append("a declaration")

    def handle_pi(self, data):
        self.unsafe.append("a processing instruction")

    def unknown_decl(self, data):
        self.unsafe.append("a CDATA section")


def _safe_url(url: str, image: bool) -> bool:
    """A plain link or image: http(s), mailto, an anchor, an inline image, or a path below the
    page that does not start at the server's root (an image loads by itself, so its path must
    also stay in the submission's folder: no '..')."""
    url = re.sub(r"[\x00-\x20]", "", html.unescape(url)).lower()   # as a browser reads it
    if url.startswith("#"):
        return True
    if re.match(r"[a-z][a-z0-9+.-]*:", url):
        return url.startswith(LINK_SCHEMES) or image and url.startswith("data:image/")
    if url.startswith(("/", "\\")):
        return False
    return not image or ".." not in re.split(r"[/\\]", url)


# Larger fragments are not inspected: they count as unsafe (shown as text, or removed). Inspection
# takes time linear in the size (up to ~3 s per million characters on a busy 2-core machine), and
# the caps keep a submission's inspection within seconds: a markdown cell's source (the course's
# longest is 4,400 characters; mistune takes up to ~15 s per million), and the HTML of one
# fragment (a rendered cell with its attachments, an output, a raw cell).
MAX_MARKDOWN_CHARS = 100_000
MAX_HTML_CHARS = 2_000_000


def _inspect(inspector: HTMLParser, fragment: str) -> None:
    """Feed ``fragment`` to ``inspector``, in time linear in its size. What is left unread is
    an unfinished tag, which would end inside the page's own next tag in a browser: unsafe, and
    not closed (close() retries it at every later '<': quadratic, 3.7 s for 36,000 characters
    of ``<a b='``). Markup the parser rejects (it asserts on ``<![<!``) is unsafe too."""
    try:
        inspector.feed(fragment)
        if "<" in inspector.rawdata:
            inspector.unsafe_found("an unfinished tag")
        else:
            inspector.close()              # only text is left
    except (AssertionError, ValueError, IndexError):
        inspector.unsafe_found("markup that cannot be read safely")


def unsafe_html(fragment: str) -> list[str]:
    """What in ``fragment`` could run or load something in a browser (empty: nothing)."""
    if len(fragment) > MAX_HTML_CHARS:
        return [f"more than {MAX_HTML_CHARS:,} characters of HTML (not inspected)"]
    inspector = _Inspector()
    _inspect(inspector, fragment)
    return sorted(set(inspector.unsafe))


def rendered_markdown(source: str, attachments: dict | None = None) -> str:
    """The HTML nbconvert makes of a markdown cell (the renderer its HTML templates use)."""
    return MarkdownWithMath(renderer=IPythonRenderer(escape=False, attachments=attachments or {})).render(source)


def unsafe_markdown(source: str, attachments: dict | None = None) -> list[str]:
    if "<" not in source and "](" not in source and "]:" not in source:
        return []                                     # no HTML, no link, no image: nothing to run
    if len(source) > MAX_MARKDOWN_CHARS:
        return [f"more than {MAX_MARKDOWN_CHARS:,} characters of markdown (not inspected)"]
    try:
        return unsafe_html(rendered_markdown(source, attachments))
    except Exception as error:                        # what nbconvert cannot render is not shown
        return [f"markdown nbconvert cannot render ({type(error).__name__})"]


def as_text(source: str) -> str:
    """Markdown that shows ``source`` as it was written, as a code block (nothing in it renders)."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", source)), default=0))
    return f"*Shown as text by the grader:*\n\n{fence}text\n{source}\n{fence}"


def markdown_text(text: str) -> str:
    """``text`` escaped for a Markdown cell: it shows as exactly these characters, on one line,
    with no math typeset (MathJax leaves the tex2jax_ignore class alone, in JupyterLab too)."""
    text = re.sub(r"[\x00-\x1f\x7f-\x9f]", "\ufffd", text)
    # Markup that makes a link, an image, code or emphasis; HTML goes as entities.
    escaped = re.sub(r"([\\`*_\[\]()!])", r"\\\1", html.escape(text, quote=False))
    return f'<span class="tex2jax_ignore">{escaped}</span>'


def _flag(resources, message: str) -> None:
    resources.setdefault("gpulab_flags", []).append(message)


def _where(cell, index: int) -> str:
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    return f"cell {index + 1}" + (f" ({grade_id!r})" if grade_id else "")


class SanitizeMarkdown(NbGraderPreprocessor):
    """Markdown and raw cells, and their attachments, made safe to render (before the run)."""

    max_cell_attachment_chars = Integer(1_000_000, help="Attachments kept per cell, in characters "
                                        "of base64.").tag(config=True)
    max_notebook_attachment_chars = Integer(5_000_000, help="Attachments kept per notebook, in "
                                            "characters of base64.").tag(config=True)

    def preprocess(self, nb, resources):
        self._attachment_chars = 0
        nb.metadata.pop("widgets", None)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type in ("markdown", "raw"):
            self._cap_attachments(cell, resources, index)
            found = unsafe_markdown(cell.source, cell.get("attachments")) if cell.cell_type == "markdown" \
                else unsafe_html(cell.source)
            if found:
                _flag(resources, f"showed {_where(cell, index)} as text: it held {', '.join(found)}")
                cell.pop("attachments", None)
                if cell.cell_type == "markdown":
                    cell.source = as_text(cell.source)
                else:                           # a raw cell: its text, escaped, and no longer HTML
                    cell.source = html.escape(cell.source)
                    cell.metadata.pop("raw_mimetype", None)
                    cell.metadata.pop("format", None)
        return cell, resources

    def _cap_attachments(self, cell, resources, index) -> None:
        attachments = cell.get("attachments")
        if not isinstance(attachments, dict):
            cell.pop("attachments", None)
            attachments = {}
        kept, cell_chars = {}, 0
        for name, bundle in attachments.items():
            image = {m: v for m, v in bundle.items() if m in IMAGE_MIMES and isinstance(v, str)} \
                if isinstance(bundle, dict) else {}
            size = sum(len(v) for v in image.values())
            if not image:
                _flag(resources, f"removed attachment {name!r} of {_where(cell, index)}: not an image")
            elif cell_chars + size > self.max_cell_attachment_chars or \
                    self._attachment_chars + size > self.max_notebook_attachment_chars:
                _flag(resources, f"removed attachment {name!r} of {_where(cell, index)}: over the "
                                 f"limits of {self.max_cell_attachment_chars:,} characters per cell "
                                 f"and {self.max_notebook_attachment_chars:,} per notebook")
            else:
                kept[name] = image
                cell_chars += size
                self._attachment_chars += size
                continue
            kept[name] = {"image/png": EMPTY_PNG}
        if cell.cell_type == "markdown":
            for name in set(re.findall(r"attachment:([^\s)\"'>]+)", cell.source)) - set(kept):
                _flag(resources, f"{_where(cell, index)} shows attachment {name!r}, which it does not "
                                 "have: an empty image stands in")
                kept[name] = {"image/png": EMPTY_PNG}
        if kept:
            cell.attachments = kept
        else:
            cell.pop("attachments", None)


class SanitizeOutputs(NbGraderPreprocessor):
    """Outputs made safe to render (after the run): scripts and widgets out."""

    def preprocess(self, nb, resources):
        nb.metadata.pop("widgets", None)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        outputs = []
        for output in cell.get("outputs", []):
            data = output.get("data")
            if output.get("output_type") not in ("display_data", "execute_result") or not isinstance(data, dict):
                outputs.append(output)
                continue
            data.pop("application/vnd.jupyter.widget-view+json", None)
            removed = [f"{mime} that is not text" for mime in _not_text(data)]
            if data.pop("application/javascript", None) is not None:
                removed.append("JavaScript")
            for mime, check in (("text/html", unsafe_html), ("image/svg+xml", unsafe_svg),
                                ("text/markdown", unsafe_markdown)):
                value = data.get(mime)
                found = check(value if isinstance(value, str) else json.dumps(value)) if mime in data else []
                if found:
                    del data[mime]
                    removed.append(f"{mime} holding {', '.join(found)}")
            output["metadata"] = _plain_metadata(output.get("metadata"))
            if removed:
                _flag(resources, f"removed from the output of {_where(cell, index)}: {'; '.join(removed)}")
            if data:
                outputs.append(output)
            elif removed:
                outputs.append(_note(f"[an output was removed by the grader: {'; '.join(removed)}]"))
        cell.outputs = outputs
        return cell, resources


def _not_text(data: dict) -> list[str]:
    """Drop what nbconvert's templates would choke on: a value that is not a string, for a
    type that must be one (JSON types may be objects)."""
    def text(value) -> bool:            # a string, or nbformat's list of lines
        return isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value)
    odd = [mime for mime, value in data.items() if not text(value) and not mime.endswith("json")]
    for mime in odd:
        del data[mime]
    return odd


def _plain_metadata(metadata) -> dict:
    """An output's metadata as nbconvert's templates read it: per type a dict of plain values
    (width, height, isolated), other keys plain values; no 'filenames' (a graded copy has no
    extracted files). One odd value stopped the feedback of the whole class."""
    plain = {}
    for key, value in (metadata or {}).items() if isinstance(metadata, dict) else ():
        scalar = (str, int, float, bool)
        if "/" in key and isinstance(value, dict):
            plain[key] = {k: v for k, v in value.items() if isinstance(v, scalar)}
        elif "/" not in key and key != "filenames" and isinstance(value, scalar):
            plain[key] = value
    return plain


class _SvgInspector(HTMLParser):
    """What in an SVG image could run or load something (a deny-list: matplotlib's own SVG has
    styles, clip paths, glyphs it <use>s by #id and inline PNGs, all of which stay)."""

    RUNS = {"script", "foreignobject", "iframe", "embed", "object", "handler", "listener"}

    def __init__(self):
        super().__init__()
        self.unsafe: set[str] = set()

    def unsafe_found(self, what: str) -> None:
        self.unsafe.add(what)

    def handle_starttag(self, tag, attrs):
        if tag in self.RUNS:
            self.unsafe.add(f"a <{tag}> element")
        for name, value in attrs:
            plain = re.sub(r"[\x00-\x20]", "", value or "").lower()
            if name.startswith("on"):
                self.unsafe.add("an event handler")
            elif re.search(r"(java|vb)script:|data:text", plain):
                self.unsafe.add("a script URL")
            elif name in ("href", "xlink:href") and not plain.startswith(("#", "data:image/")):
                self.unsafe.add("a link")
            elif tag in ("animate", "set") and name == "attributename" and (
                    "href" in plain or plain.startswith("on")):
                self.unsafe.add("an animated link")

    handle_startendtag = handle_starttag


def unsafe_svg(svg: str) -> list[str]:
    """What in an SVG image could run or load something (empty: nothing)."""
    if len(svg) > MAX_HTML_CHARS:
        return [f"more than {MAX_HTML_CHARS:,} characters of SVG (not inspected)"]
    inspector = _SvgInspector()
    _inspect(inspector, svg)
    return sorted(inspector.unsafe)


def _note(text: str):
    return nbformat.v4.new_output("stream", name="stdout", text=text + "\n")
