"""How a chapter's prose reads, in three figures: mean words per sentence, the share of sentences
over 35 words, and colons per sentence (issue 35's measure; `make bench` prints it).

    python scripts/prose_stats.py                 # every chapter under solutions/
    python scripts/prose_stats.py 05 06           # chapters whose folder starts so
    python scripts/prose_stats.py --long 05       # and list that chapter's sentences over 35 words

What counts as prose: the markdown cells of the solution notebook (the single source of each
chapter), without headings, tables, fenced code, display math, images and HTML tags (the text
inside <details> blocks counts: "Going deeper" is prose too), and without the generated "Words
this chapter uses" box. Inline math and inline code count as one word each; a link counts as
its text. Each list item is measured on its own; a bold lead-in ("**Conventions.**") is a label,
not a sentence. A sentence ends at '.', '!' or '?' followed by
a space; common abbreviations (e.g., i.e., et al., vs.) do not end one.

The course's targets per chapter (tests/test_prose.py holds every chapter to them): a mean of at
most 20 words, at most 8% of sentences over 35 words, at most 0.25 colons per sentence. How to
Scale Your Model, measured the same way, gives 21-30 words, 16-27% and 0.21-0.34.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEAN_WORDS_MAX = 20.0
LONG_WORDS = 35
LONG_SHARE_MAX = 0.08
COLONS_PER_SENTENCE_MAX = 0.25
# The generated box of glossary terms at the top of each chapter (scripts/glossary.py) is not prose.
WORDS_BOX_ID = "words-this-chapter-uses"

_ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "cf.", "etc.", "approx.", "Fig.", "Eq.", "No.")
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)[^$\n]+?\$")
_INLINE_CODE = re.compile(r"`+[^`\n]+?`+")
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_TAG = re.compile(r"<[^>\n]+>")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?])[*_\"')\]]*\s+")
_WORD = re.compile(r"[^\W_]", re.U)


@dataclass
class ProseStats:
    chapter: str
    sentences: list[str]

    @property
    def lengths(self) -> list[int]:
        return [len([w for w in s.split() if _WORD.search(w)]) for s in self.sentences]

    @property
    def mean_words(self) -> float:
        return statistics.fmean(self.lengths) if self.sentences else 0.0

    @property
    def long_share(self) -> float:
        return sum(n > LONG_WORDS for n in self.lengths) / max(len(self.sentences), 1)

    @property
    def colons_per_sentence(self) -> float:
        return sum(s.count(":") for s in self.sentences) / max(len(self.sentences), 1)

    def long_sentences(self) -> list[str]:
        return [s for s, n in zip(self.sentences, self.lengths) if n > LONG_WORDS]

    def failures(self) -> list[str]:
        """The targets this chapter misses, in words (empty: it meets them all)."""
        found = []
        if self.mean_words > MEAN_WORDS_MAX:
            found.append(f"mean sentence {self.mean_words:.1f} words (target <= {MEAN_WORDS_MAX:.0f})")
        if self.long_share > LONG_SHARE_MAX:
            found.append(f"{self.long_share:.0%} of sentences over {LONG_WORDS} words "
                         f"(target <= {LONG_SHARE_MAX:.0%})")
        if self.colons_per_sentence > COLONS_PER_SENTENCE_MAX:
            found.append(f"{self.colons_per_sentence:.2f} colons per sentence "
                         f"(target <= {COLONS_PER_SENTENCE_MAX})")
        return found


def prose_blocks(markdown: str) -> list[str]:
    """The prose of one markdown cell as blocks (paragraphs and list items), markup removed."""
    text = _FENCE.sub("\n\n", markdown)
    text = _DISPLAY_MATH.sub("\n\n", text)
    text = _IMAGE.sub(" ", text)
    text = _INLINE_MATH.sub(" X ", text)
    text = _INLINE_CODE.sub(" C ", text)
    text = _LINK.sub(r"\1", text)
    text = _TAG.sub(" ", text)
    blocks, current = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "|")) or re.fullmatch(r"[-=*_ ]{3,}", stripped):
            blocks.append(" ".join(current))
            current = []
        elif _LIST_ITEM.match(line):
            blocks.append(" ".join(current))
            current = [_LIST_ITEM.sub("", line, count=1).strip()]
        else:
            current.append(stripped)
    blocks.append(" ".join(current))
    return [b for b in blocks if _WORD.search(b)]


def sentences_of(block: str) -> list[str]:
    protected = block
    for i, abbreviation in enumerate(_ABBREVIATIONS):
        protected = protected.replace(abbreviation, abbreviation.replace(".", f"\0{i}\0"))
    parts = _SENTENCE_END.split(protected)
    restored = []
    for part in parts:
        part = re.sub(r"\0\d+\0", ".", part).strip()
        # A bold lead-in ("**Conventions.**") is a label, not a sentence.
        if _WORD.search(part) and not re.fullmatch(r"\*\*[^*]+(\*\*)?", part):
            restored.append(part)
    return restored


def chapter_stats(notebook: Path) -> ProseStats:
    cells = json.loads(notebook.read_text())["cells"]
    sentences = []
    for cell in cells:
        if cell["cell_type"] != "markdown" or cell.get("id") == WORDS_BOX_ID:
            continue
        for block in prose_blocks("".join(cell["source"])):
            sentences.extend(sentences_of(block))
    return ProseStats(notebook.parent.name, sentences)


def chapter_notebooks(prefixes: list[str]) -> list[Path]:
    found = sorted((ROOT / "solutions").glob("*/*.ipynb"))
    return [p for p in found if not prefixes or p.parent.name.startswith(tuple(prefixes))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="chapter folder prefixes, e.g. 05 (default: all)")
    parser.add_argument("--long", action="store_true", help="list the sentences over 35 words")
    args = parser.parse_args()
    print(f"{'chapter':<34}{'sentences':>10}{'mean words':>12}{'> 35 words':>12}{'colons/sent':>13}  targets")
    for notebook in chapter_notebooks(args.chapters):
        stats = chapter_stats(notebook)
        verdict = "met" if not stats.failures() else "missed"
        print(f"{stats.chapter:<34}{len(stats.sentences):>10}{stats.mean_words:>12.1f}"
              f"{stats.long_share:>12.0%}{stats.colons_per_sentence:>13.2f}  {verdict}")
        if args.long:
            for sentence in stats.long_sentences():
                print(f"    [{len(sentence.split())}] {sentence}")
    print(f"targets: mean <= {MEAN_WORDS_MAX:.0f} words, <= {LONG_SHARE_MAX:.0%} over {LONG_WORDS} words, "
          f"<= {COLONS_PER_SENTENCE_MAX} colons per sentence")


if __name__ == "__main__":
    main()
