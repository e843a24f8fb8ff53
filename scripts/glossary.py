"""The course glossary: every term defined, in plain words, before it is used (issues 35 and 36).

One source: `book/glossary/NN_topic.yml`, one file per chapter, listing the terms that chapter
introduces (its home chapter)::

    - term: streaming multiprocessor      # as the glossary lists it
      forms: [SM]                         # other spellings the chapters use (optional)
      section: "3. Inside the GPU"        # heading text (without #) of the section defining it
      means: >-
        One of the GPU's many processors. An H100 has 132; each runs many threads at once.

    python scripts/glossary.py            # validate, then check the rules below; exit 1 on a problem
    python scripts/glossary.py --write    # regenerate each chapter's box and book/glossary.md
    python scripts/glossary.py --check    # exit 1, naming them, if the box or the page is stale

What the chapters are held to (tests/test_glossary.py):

- Matching. Each of `term` and `forms` matches as a whole word, with an optional plural s/es. A
  hyphenated compound is one word ("reduce" does not occur in "reduce-scatter", nor "GPU" in
  "per-GPU"), and so is an identifier ("rank" does not occur in `get_rank`). A form with a
  capital letter or a digit matches case-sensitively, the others case-insensitively.
- The text read. The markdown cells of solutions/*/*.ipynb in course order (chapter folders
  sorted, cells in order), parsed as the book parses them (MyST, with its dollarmath, amsmath and
  colon_fence extensions). Left out: headings, fenced code, display and inline math, images, the
  generated box; HTML tags are dropped and the text between them counts (so "Going deeper" and
  "Why" blocks count); inline code counts. Each paragraph, list item and table row is split
  into sentences at '.', '!' or '?' followed by a space (e.g., i.e., vs. and the like do not end
  one).
- A definition is a sentence that writes one of the term's forms in italics (`*SM*`, `_SM_`,
  `***SM***`, `` *`GradScaler`* ``; the italic text is exactly the form, a plural allowed) or that
  holds a markdown link whose target names the glossary (`[SM](../../book/glossary.md)`).
- The rules: the first occurrence of any form of a term, in course order, is in a definition;
  the term's home chapter has a heading whose text is `section` (compared without backticks,
  asterisks and extra spaces), and that section (up to the next heading of its level or above)
  holds an italic definition of it.

What --write generates:

- in every chapter, a markdown cell with id `words-this-chapter-uses` right after the title cell:
  a closed <details> block listing the terms new in the chapter (its own, and those of a later
  chapter it defines in passing) and the terms of earlier chapters it uses, each with its
  definition (scripts/build_book.py turns it into a closed dropdown; scripts/prose_stats.py
  leaves it out);
- book/glossary.md: every term, alphabetically, with its definition and a link to the section
  that introduces it (a MyST heading anchor: book/_config.yml sets `myst_heading_anchors`).
After --write, regenerate the releases (`python autograder/release.py`): the box is part of them.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import nbformat
import yaml
from markdown_it.renderer import RendererHTML
from myst_parser.config.main import MdParserConfig
from myst_parser.mdit_to_docutils.base import default_slugify
from myst_parser.parsers.mdit import create_md_parser

ROOT = Path(__file__).resolve().parent.parent
BOX_ID = "words-this-chapter-uses"
BOX_TITLE = "Words this chapter uses"
PAGE = Path("book") / "glossary.md"
PAGE_FROM_NOTEBOOK = "../../book/glossary.md"     # the page, from solutions/NN/ and notebooks/NN/
REQUIRED_KEYS = ("term", "section", "means")
OPTIONAL_KEYS = ("forms",)
MYST_EXTENSIONS = {"dollarmath", "amsmath", "colon_fence"}   # as book/_config.yml
ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "cf.", "etc.", "approx.", "Fig.", "Eq.", "No.")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
_MATH = " \u22ef "           # what inline math leaves in the text: no word, no form matches it


def _markdown():
    return create_md_parser(MdParserConfig(enable_extensions=MYST_EXTENSIONS), RendererHTML)


def _normal_heading(text: str) -> str:
    """A heading's text as a `section:` names it: without #s, backticks, asterisks, extra spaces."""
    text = re.sub(r"^\s*#+\s*|\s+#+\s*$", "", text)
    return " ".join(text.replace("`", "").replace("*", "").split())


# --------------------------------------------------------------------------------------------
# Terms


@dataclass(frozen=True)
class Term:
    term: str
    forms: tuple[str, ...]
    section: str
    means: str
    chapter: str          # the home chapter's folder, e.g. "03_throughput"
    source: str           # the yml file, for messages

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.term, *self.forms)

    @cached_property
    def patterns(self) -> tuple[re.Pattern, ...]:
        return tuple(form_pattern(f) for f in self.spellings)

    def is_spelled(self, text: str) -> bool:
        """Is `text` (an italic span) exactly one of the forms, a plural allowed?"""
        return any(p.fullmatch(text.strip()) for p in self.patterns)


def form_regex(form: str) -> str:
    """A form as a whole word, plural s/es allowed: not next to a letter, digit, underscore or
    hyphen (a hyphenated compound or an identifier is one word). Case-sensitive if the form has
    a capital letter or a digit, else not."""
    words = r"\s+".join(re.escape(w) for w in form.split())
    flag = "" if any(c.isupper() or c.isdigit() for c in form) else "i"
    return rf"(?<![\w-])(?{flag}:{words}(?:e?s)?)(?![\w-])"


def form_pattern(form: str) -> re.Pattern:
    return re.compile(form_regex(form))


class Matcher:
    """Which terms a text uses. The longest form wins where forms overlap: "dynamic loss
    scaling" is one use of its own term, not also one of "loss scaling".

    One alternation of every form, tried at every character of every sentence, took 29 s for the
    course (about 400 forms, 5,600 sentences). A form can match only where its first word occurs
    (as it is spelled, or lower-cased): each text is searched with the alternation of the forms
    whose first word it contains, in the same order, so the result is the same."""

    def __init__(self, terms: list[Term]):
        self.spelled = sorted(((s, t) for t in terms for s in t.spellings), key=lambda st: -len(st[0]))
        self.first_words = [s.split()[0].lower() for s, _ in self.spelled]
        self.term_of = {f"g{i}": t for i, (_, t) in enumerate(self.spelled)}
        self.patterns: dict[tuple[int, ...], re.Pattern] = {}

    def pattern(self, forms: tuple[int, ...]) -> re.Pattern:
        if forms not in self.patterns:
            self.patterns[forms] = re.compile("|".join(
                f"(?P<g{i}>{form_regex(self.spelled[i][0])})" for i in forms))
        return self.patterns[forms]

    def terms_in(self, text: str) -> set[Term]:
        lowered = text.lower()
        forms = tuple(i for i, word in enumerate(self.first_words) if word in lowered)
        if not forms:
            return set()
        return {self.term_of[m.lastgroup] for m in self.pattern(forms).finditer(text)}


def chapter_folders(root: Path) -> list[str]:
    return sorted(p.parent.name for p in (root / "solutions").glob("*/*.ipynb"))


def notebook_path(root: Path, chapter: str) -> Path:
    return root / "solutions" / chapter / f"{chapter}.ipynb"


def load_terms(root: Path) -> tuple[list[Term], list[str]]:
    """Every term of book/glossary/*.yml, and what is wrong with the files (empty: nothing)."""
    terms, errors = [], []
    chapters = set(chapter_folders(root))
    for path in sorted((root / "book" / "glossary").glob("*.yml")):
        where = path.relative_to(root).as_posix()
        if path.stem not in chapters:
            errors.append(f"{where}: no chapter solutions/{path.stem}/ (a file is named after its chapter)")
            continue
        try:
            entries = yaml.safe_load(path.read_text()) or []
        except yaml.YAMLError as error:
            errors.append(f"{where}: not YAML: {error}")
            continue
        if not isinstance(entries, list):
            errors.append(f"{where}: a list of terms (- term: ...) expected")
            continue
        for n, entry in enumerate(entries, 1):
            label = f"{where}, entry {n}" + (f" ({entry.get('term')!r})" if isinstance(entry, dict) else "")
            if not isinstance(entry, dict):
                errors.append(f"{label}: a mapping with keys {', '.join(REQUIRED_KEYS)} expected")
                continue
            missing = [k for k in REQUIRED_KEYS if not isinstance(entry.get(k), str) or not entry[k].strip()]
            unknown = sorted(set(entry) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
            forms = entry.get("forms") or []
            if missing:
                errors.append(f"{label}: missing or empty {', '.join(missing)} (text expected)")
            if unknown:
                errors.append(f"{label}: unknown key {', '.join(unknown)} "
                              f"(keys: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)})")
            if not isinstance(forms, list) or not all(isinstance(f, str) and f.strip() for f in forms):
                errors.append(f"{label}: forms is a list of spellings, e.g. [SM]")
                forms = []
            if missing:
                continue
            terms.append(Term(entry["term"].strip(), tuple(f.strip() for f in forms),
                              entry["section"].strip(), " ".join(entry["means"].split()),
                              path.stem, where))
    errors += _overlaps(terms)
    return terms, errors


def _overlaps(terms: list[Term]) -> list[str]:
    """Each form belongs to one term only: no form of one term matches a form of another
    (nor the same term twice)."""
    errors = []
    spelled = [(t, s, p) for t in terms for s, p in zip(t.spellings, t.patterns)]
    for i, (a, form_a, pattern_a) in enumerate(spelled):
        for b, form_b, pattern_b in spelled[i + 1:]:
            if pattern_a.fullmatch(form_b) or pattern_b.fullmatch(form_a):
                if a is not b:     # a plural listed beside its singular is harmless
                    errors.append(f"{form_a!r} ({a.term!r}, {a.source}) and {form_b!r} ({b.term!r}, "
                                  f"{b.source}) are the same word: a form belongs to one term only")
    return errors


# --------------------------------------------------------------------------------------------
# The chapters' text, as sentences


@dataclass
class Sentence:
    chapter: str
    cell: str              # the cell's id
    sections: tuple[str, ...]   # the headings it lies under, outermost first, normalised
    text: str              # what it reads: markup gone, inline code kept, math a placeholder
    italics: list[str] = field(default_factory=list)   # the text of its italic spans
    links_glossary: bool = False

    def defines(self, term: Term) -> bool:
        return self.links_glossary or self.defines_in_italics(term)

    def defines_in_italics(self, term: Term) -> bool:
        return any(term.is_spelled(span) for span in self.italics)


@dataclass
class _Run:
    """A paragraph, list item or table row as flat text, with its italic and link spans."""
    text: str = ""
    italics: list[tuple[int, int]] = field(default_factory=list)
    glossary_links: list[tuple[int, int]] = field(default_factory=list)


def _flatten(inline, run: _Run) -> None:
    em_start, link_start, link_to_glossary = [], None, False
    for child in inline.children or []:
        kind = child.type
        if kind in ("text", "code_inline"):
            run.text += child.content
        elif kind in ("softbreak", "hardbreak"):
            run.text += " "
        elif kind in ("math_inline", "math_inline_double"):
            run.text += _MATH
        elif kind == "em_open":
            em_start.append(len(run.text))
        elif kind == "em_close" and em_start:
            run.italics.append((em_start.pop(), len(run.text)))
        elif kind == "link_open":
            link_start, link_to_glossary = len(run.text), "glossary" in child.attrs.get("href", "")
        elif kind == "link_close" and link_start is not None:
            if link_to_glossary:
                run.glossary_links.append((link_start, len(run.text)))
            link_start = None
        elif kind == "html_inline":
            if re.search(r"href=[\"'][^\"']*glossary", child.content):
                link_start, link_to_glossary = len(run.text), True
            elif child.content.startswith("</a") and link_start is not None and link_to_glossary:
                run.glossary_links.append((link_start, len(run.text)))
                link_start = None
        # images, strong markers and anything else add no text


def sentences_of_run(run: _Run) -> list[tuple[int, int]]:
    """(start, end) of each sentence of a run."""
    protected = run.text
    for abbreviation in ABBREVIATIONS:
        protected = protected.replace(abbreviation, abbreviation.replace(".", "\0"))
    spans, start = [], 0
    for end in _SENTENCE_END.finditer(protected):
        spans.append((start, end.start()))
        start = end.end()
    spans.append((start, len(run.text)))
    return [(s, e) for s, e in spans if run.text[s:e].strip()]


def cell_sentences(source: str, chapter: str, cell: str, headings: list[tuple[int, str]],
                   md=None) -> list[Sentence]:
    """The sentences of one markdown cell. `headings` is the stack of (level, normalised text)
    the cell starts under; it is updated with the cell's own headings."""
    md = md or _markdown()
    lines = source.splitlines()
    runs: list[tuple[_Run, tuple[str, ...]]] = []
    row: _Run | None = None
    tokens = md.parse(source)
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            level = int(token.tag[1])
            while headings and headings[-1][0] >= level:
                headings.pop()
            raw = lines[token.map[0]] if token.map else tokens[i + 1].content
            headings.append((level, _normal_heading(raw)))
        elif token.type == "inline":
            if tokens[i - 1].type == "heading_open":
                continue
            if row is not None:                    # a table cell: the row is one run
                if row.text:
                    row.text += " | "
                _flatten(token, row)
            else:
                run = _Run()
                _flatten(token, run)
                runs.append((run, tuple(h for _, h in headings)))
        elif token.type == "tr_open":
            row = _Run()
        elif token.type == "tr_close" and row is not None:
            runs.append((row, tuple(h for _, h in headings)))
            row = None
        elif token.type == "html_block":
            text = re.sub(r"<!--.*?-->", " ", token.content, flags=re.S)
            text = re.sub(r"<[^>]*>", " ", text)
            if text.strip():
                runs.append((_Run(" ".join(text.split())), tuple(h for _, h in headings)))
        # fences, code blocks, display math and images are not read
    found = []
    for run, sections in runs:
        for start, end in sentences_of_run(run):
            found.append(Sentence(
                chapter, cell, sections, run.text[start:end].strip(),
                [run.text[a:b] for a, b in run.italics if a < end and b > start],
                any(a < end and b > start for a, b in run.glossary_links)))
    return found


def chapter_sentences(path: Path, md=None) -> list[Sentence]:
    md = md or _markdown()
    nb = nbformat.read(path, as_version=4)
    headings: list[tuple[int, str]] = []
    found = []
    for cell in nb.cells:
        if cell.cell_type != "markdown" or cell.get("id") == BOX_ID:
            continue
        found += cell_sentences(cell.source, path.parent.name, cell.get("id", "?"), headings, md)
    return found


def chapter_headings(path: Path, md=None) -> list[tuple[str, str]]:
    """(normalised text, MyST anchor slug) of every heading of a chapter, in order. The slug is
    the one myst-parser gives the heading in the book (`myst_heading_anchors`): its text and
    inline code, lower-cased, through myst's own slugify, made unique within the page."""
    md = md or _markdown()
    nb = nbformat.read(path, as_version=4)
    found, slugs = [], set()
    for cell in nb.cells:
        if cell.cell_type != "markdown" or cell.get("id") == BOX_ID:
            continue
        lines = cell.source.splitlines()
        tokens = md.parse(cell.source)
        for i, token in enumerate(tokens):
            if token.type != "heading_open":
                continue
            inline = tokens[i + 1]
            title = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
            slug = default_slugify(title)
            n, unique = 1, slug
            while unique in slugs:
                unique, n = f"{slug}-{n}", n + 1
            slugs.add(unique)
            raw = lines[token.map[0]] if token.map else inline.content
            found.append((_normal_heading(raw), unique))
    return found


# --------------------------------------------------------------------------------------------
# The rules


@dataclass
class Course:
    """The glossary and the chapters it is checked against (the repository, or a planted copy)."""
    root: Path

    @cached_property
    def md(self):
        return _markdown()

    @cached_property
    def loaded(self) -> tuple[list[Term], list[str]]:
        return load_terms(self.root)

    @property
    def terms(self) -> list[Term]:
        return self.loaded[0]

    @property
    def errors(self) -> list[str]:
        """What is wrong with the yml files, a missing section heading included."""
        errors = list(self.loaded[1])
        for term in self.terms:
            if term.chapter in self.headings and _normal_heading(term.section) not in {
                    h for h, _ in self.headings[term.chapter]}:
                errors.append(f"{term.source}: {term.term!r}: chapter {term.chapter} has no heading "
                              f"{term.section!r}")
        return errors

    @cached_property
    def chapters(self) -> list[str]:
        return chapter_folders(self.root)

    @cached_property
    def sentences(self) -> list[Sentence]:
        """Every sentence of the course, in course order."""
        return [s for c in self.chapters for s in chapter_sentences(notebook_path(self.root, c), self.md)]

    @cached_property
    def headings(self) -> dict[str, list[tuple[str, str]]]:
        return {c: chapter_headings(notebook_path(self.root, c), self.md) for c in self.chapters}

    @cached_property
    def uses(self) -> dict[str, list[Sentence]]:
        """term -> the sentences it occurs in, in course order."""
        found = {t.term: [] for t in self.terms}
        matcher = Matcher(self.terms)
        for sentence in self.sentences:
            for term in matcher.terms_in(sentence.text):
                found[term.term].append(sentence)
        return found

    def first_use(self, term: Term) -> Sentence | None:
        uses = self.uses[term.term]
        return uses[0] if uses else None

    def unused(self) -> list[str]:
        return [f"{t.term!r} ({t.source}): no chapter uses it" for t in self.terms if not self.uses[t.term]]

    def used_before_defined(self) -> list[str]:
        """Terms whose first occurrence in course order is not in a sentence defining them."""
        found = []
        for term in self.terms:
            first = self.first_use(term)
            if first is not None and not first.defines(term):
                found.append(f"{term.term!r} ({term.source}): first used in {first.chapter}, cell "
                             f"{first.cell}, before any definition: {first.text!r} (write a form in "
                             f"italics there, link it to the glossary, or rephrase)")
        return found

    def undefined_in_home_section(self) -> list[str]:
        """Terms whose home chapter's named section writes none of their forms in italics."""
        found = []
        for term in self.terms:
            section = _normal_heading(term.section)
            home = [s for s in self.uses[term.term] if s.chapter == term.chapter and section in s.sections]
            if not any(s.defines_in_italics(term) for s in home):
                found.append(f"{term.term!r} ({term.source}): section {term.section!r} of {term.chapter} "
                             f"does not define it (no form of it in italics there)")
        return found

    def problems(self) -> list[str]:
        """Every broken rule, one line each (empty: the glossary holds)."""
        return self.errors + self.unused() + self.used_before_defined() + self.undefined_in_home_section()

    # ----------------------------------------------------------------------------------------
    # What --write generates

    def box(self, chapter: str) -> str | None:
        """The markdown of a chapter's "Words this chapter uses" cell (None: no term to list).
        New here: the chapter's own terms, and a later chapter's that it is the first to use
        (defined in passing). From earlier chapters: the others it uses, with the chapter that
        introduced them."""
        order = {c: i for i, c in enumerate(self.chapters)}
        new, earlier = [], []
        for term in sorted(self.terms, key=lambda t: t.term.lower()):
            uses = self.uses[term.term]
            if term.chapter != chapter and not any(s.chapter == chapter for s in uses):
                continue
            met = uses[0].chapter if uses else term.chapter
            if term.chapter == chapter:
                new.append(f"- **{term.term}**{_also(term)}: {term.means}")
            elif met == chapter:
                new.append(f"- **{term.term}**{_also(term)}: {term.means} "
                           f"(Chapter {_number(term.chapter)} covers it in full.)")
            elif order[term.chapter] < order[chapter]:
                earlier.append(f"- **{term.term}**{_also(term)}, from chapter {_number(term.chapter)}: "
                               f"{term.means}")
            else:
                earlier.append(f"- **{term.term}**{_also(term)}, from chapter {_number(met)} (chapter "
                               f"{_number(term.chapter)} covers it in full): {term.means}")
        if not new and not earlier:
            return None
        parts = [f"<details><summary>{BOX_TITLE}</summary>", ""]
        if new:
            parts += ["New in this chapter:", "", *new, ""]
        if earlier:
            parts += ["From earlier chapters:", "", *earlier, ""]
        parts += [f"Every term of the course, with the section that introduces it: "
                  f"[the glossary]({PAGE_FROM_NOTEBOOK}).", "", "</details>"]
        return "\n".join(parts)

    def page(self) -> str:
        """book/glossary.md: every term, alphabetically, linked to the section introducing it."""
        lines = ["# Glossary", "",
                 "Every term the course defines, in plain words, with the section that introduces it. "
                 "Each chapter opens with a box of the words it uses.", "",
                 "<!-- Generated by `python scripts/glossary.py --write` from book/glossary/*.yml "
                 "(one file per chapter): edit those files, not this page. -->", ""]
        letter = None
        for term in sorted(self.terms, key=lambda t: t.term.lower()):
            first = term.term[0].upper() if term.term[0].isalpha() else "#"
            if first != letter:
                letter = first
                lines += [""] * (lines[-1] != "") + [f"## {letter if letter != '#' else 'Symbols and numbers'}", ""]
            slug = next((slug for heading, slug in self.headings.get(term.chapter, [])
                         if heading == _normal_heading(term.section)), "")
            target = f"chapters/{term.chapter}.ipynb" + (f"#{slug}" if slug else "")
            lines.append(f"- **{term.term}**{_also(term)}: {term.means} Introduced in "
                         f"[chapter {_number(term.chapter)}, {term.section}]({target}).")
        if not self.terms:
            lines.append("No terms yet.")
        return "\n".join(lines).rstrip("\n") + "\n"

    def generated(self) -> dict[Path, object]:
        """Every file --write produces: book/glossary.md's text, and each chapter's notebook
        with its box in place (a notebook is compared as a notebook, not byte for byte)."""
        out: dict[Path, object] = {self.root / PAGE: self.page()}
        for chapter in self.chapters:
            path = notebook_path(self.root, chapter)
            nb = nbformat.read(path, as_version=4)
            nb.cells = [c for c in nb.cells if c.get("id") != BOX_ID]
            box = self.box(chapter)
            if box is not None:
                cell = nbformat.v4.new_markdown_cell(box)
                cell.id = BOX_ID
                nb.cells.insert(1, cell)
            out[path] = nb
        return out

    def _differs(self, path: Path, content) -> bool:
        if not path.exists():
            return True
        if isinstance(content, str):
            return path.read_text() != content
        return nbformat.read(path, as_version=4) != content

    def stale(self) -> list[str]:
        """The generated files that differ from what --write would write."""
        return [(f"{PAGE.as_posix()} is stale" if path.suffix == ".md" else
                 f"the box '{BOX_TITLE}' of {path.relative_to(self.root).as_posix()} is stale")
                for path, content in self.generated().items() if self._differs(path, content)]

    def write(self) -> list[Path]:
        changed = []
        for path, content in self.generated().items():
            if self._differs(path, content):
                if isinstance(content, str):
                    path.write_text(content)
                else:
                    nbformat.write(content, path)
                changed.append(path)
        return changed


def _also(term: Term) -> str:
    return f" ({', '.join(term.forms)})" if term.forms else ""


def _number(chapter: str) -> str:
    return chapter.split("_", 1)[0]


def main(argv: list[str] | None = None, root: Path = ROOT) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="regenerate the chapter boxes and book/glossary.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if a box or the page is stale")
    args = parser.parse_args(argv)
    course = Course(root)
    if course.errors:
        print("\n".join(["The glossary files do not validate:", *course.errors]), file=sys.stderr)
        sys.exit(1)
    if args.write:
        changed = course.write()
        for path in changed:
            print(f"wrote {path.relative_to(root)}")
        if any(p.suffix == ".ipynb" for p in changed):
            print("now regenerate the releases: .venv/bin/python autograder/release.py")
        return
    if args.check:
        stale = course.stale()
        print("\n".join(stale) or "the boxes and book/glossary.md are up to date")
        if stale:
            print("run: .venv/bin/python scripts/glossary.py --write", file=sys.stderr)
        sys.exit(1 if stale else 0)
    problems = course.problems()
    print(f"{len(course.terms)} terms in book/glossary/ ({len(course.chapters)} chapters)")
    print("\n".join(problems) or "every term is defined where it is first used and in its home section")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
