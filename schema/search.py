"""The search query syntax, shared by `ContextReader.search`, `/context search` (`search.v1`)
and `contextlog search`: a query as a person types it, turned into a Postgres `tsquery`
for the `contextlog_search` text search configuration (migration 016).

    rollback plan          both words, anywhere in a message (and so for every word)
    "roll back the deploy" these words in this order, next to each other
    roll*                  a word starting with `roll` (rollback, rolled, roll-out)
    -draft   -"old plan"   leave out messages with this word or phrase
    staging OR prod        either (OR binds tighter than the space: `a b OR c` is a and
                           one of b or c); `|` works too

Case and accents are ignored (`Café` finds `cafe`); no word is stemmed or dropped as a
stop word, in any language, so a word is found as written or by its prefix. Han and kana
(Chinese, Japanese) are written without spaces: each of their characters is a word of its
own, and a run of them is a phrase (`回滚` finds 回滚 inside any sentence).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MAX_QUERY: Final = 500
MAX_TERMS: Final = 32

# Scripts written without spaces between words (Han, Hiragana, Katakana, CJK
# compatibility ideographs): split into one word a character, in the stored text
# (`contextlog_search_spaced`, 016) and in queries alike. The same ranges as the SQL's.
CJK: Final = re.compile("([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff])")
_OR: Final = frozenset({"OR", "|"})


class QueryError(ValueError):
    """Raised when a search query cannot be searched for; the message says why."""


@dataclass(frozen=True)
class Term:
    """One word or phrase of a query: `prefix` (word*) or excluded (-word)."""

    text: str
    phrase: bool = False
    prefix: bool = False
    negated: bool = False

    def tsquery(self) -> str:
        """This term as a `to_tsquery` operand: quoted (the configuration's parser splits
        and normalises it), CJK characters spaced, `:*` for a prefix, `!` to exclude."""
        body = spaced(self.text).replace("\\", "\\\\").replace("'", "''")
        return ("!" if self.negated else "") + f"'{body}'" + (":*" if self.prefix else "")


def spaced(text: str) -> str:
    """`text` with every CJK character set apart by spaces (one word each)."""
    return CJK.sub(r" \1 ", text) if CJK.search(text) else text


def _words(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def tokens(query: str) -> list[Term | str]:
    """The query's terms and OR operators, in order (terms without a letter or digit,
    such as `?` or `--`, are left out: no document holds them as words)."""
    if "\x00" in query:
        raise QueryError("the query holds a NUL character")
    out: list[Term | str] = []
    i, n = 0, len(query)
    while i < n:
        if query[i].isspace():
            i += 1
            continue
        negated = query[i] == "-" and i + 1 < n and not query[i + 1].isspace()
        start = i + 1 if negated else i
        if start < n and query[start] == '"':
            end = query.find('"', start + 1)
            end = n if end < 0 else end
            text, i = query[start + 1 : end], end + 1
            term = Term(" ".join(text.split()), phrase=True, negated=negated)
        else:
            end = start
            while end < n and not query[end].isspace():
                end += 1
            word, i = query[start:end], end
            if not negated and word in _OR:
                out.append("OR")
                continue
            prefix = word.endswith("*")
            term = Term(word.rstrip("*"), prefix=prefix and _words(word), negated=negated)
        if _words(term.text):
            out.append(term)
    return out


def clauses(query: str) -> list[list[Term]]:
    """The query as an AND of OR-groups of terms."""
    groups: list[list[Term]] = []
    joined = False
    for token in tokens(query):
        if token == "OR":
            joined = bool(groups)
            continue
        assert isinstance(token, Term)
        if joined:
            groups[-1].append(token)
        else:
            groups.append([token])
        joined = False
    return groups


def to_tsquery(query: str) -> str:
    """The `to_tsquery('contextlog_search', ...)` input for a query, or `QueryError`."""
    if len(query) > MAX_QUERY:
        raise QueryError(f"the query is {len(query)} characters long; at most {MAX_QUERY}")
    groups = clauses(query)
    count = sum(len(g) for g in groups)
    if count > MAX_TERMS:
        raise QueryError(f"the query has {count} words and phrases; at most {MAX_TERMS}")
    if not any(not t.negated for g in groups for t in g):
        raise QueryError(
            "the query has no word to look for"
            + (" (only words to leave out)" if groups else "")
            + ': give a word, a "phrase" or a prefix*'
        )
    parts = []
    for group in groups:
        inner = " | ".join(t.tsquery() for t in group)
        parts.append(inner if len(group) == 1 else f"( {inner} )")
    return " & ".join(parts)


def check(query: str) -> str | None:
    """Why a query cannot be searched for (None: it can)."""
    try:
        to_tsquery(query)
    except QueryError as e:
        return str(e)
    return None
