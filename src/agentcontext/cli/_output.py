"""Terminal output: rich (colours, tables, syntax) on a terminal, plain text when piped.

Plain mode never writes an ANSI escape code: text is written as is, tables become
tab-separated lines with a header line, so the output can be read by `cut`, `awk` or a
spreadsheet. rich is optional (the `cli` extra): without it the output is plain everywhere,
with aligned columns instead of tabs on a terminal.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

__all__ = ["Output", "count", "one_line"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")
_ROLE_STYLES = {"user": "green", "assistant": "magenta", "system": "yellow"}
_TREE_LINE = re.compile(r"^(?P<prefix>[│├└─ ]*)(?P<id>\S+) \((?P<role>[^)]*)\): (?P<rest>.*)$")
_NARROWEST = 6  # the width a shortened column keeps in a rich table
_MARK = re.compile(r"<mark>(.*?)</mark>", re.DOTALL)


def count(number: int, noun: str) -> str:
    """``1 branch``, ``2 branches``, ``0 messages``."""
    plural = noun + ("es" if noun.endswith(("ch", "sh", "s", "x")) else "s")
    return f"{number} {noun if number == 1 else plural}"


def _isatty(file: TextIO) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False


def one_line(value: object) -> str:
    """The value as text on one line: tabs, line breaks and control characters become spaces."""
    return _CONTROL.sub(" ", str(value))


class Output:
    """Where a command writes its results (stdout).

    Args:
        rich: force rich (True) or plain (False) output; by default rich exactly when stdout
            is a terminal (``FORCE_COLOR`` / ``NO_COLOR`` are honoured as rich defines them).
        file: the stream to write to (default: ``sys.stdout``).
    """

    def __init__(self, *, rich: bool | None = None, file: TextIO | None = None) -> None:
        self._file = file if file is not None else sys.stdout
        self._console: Console | None = None
        try:
            from rich.console import Console
        except ImportError:  # the `cli` extra is not installed: plain text everywhere
            self.rich = False
            self.terminal = _isatty(self._file) if rich is None else rich
            return
        self._console = Console(file=self._file, highlight=False, emoji=False, markup=False)
        self.rich = self._console.is_terminal if rich is None else rich
        self.terminal = self.rich
        """True when the output is read by a person (rich or not): tables are aligned."""

    @property
    def console(self) -> Console:
        """The rich console (only used when `rich` is True, which implies rich is installed)."""
        assert self._console is not None
        return self._console

    # --- text -----------------------------------------------------------------------------------

    def raw(self, text: str) -> None:
        """Write text exactly as given (JSON, Mermaid), in both modes."""
        self._file.write(text)
        self._file.flush()

    def json(self, data: object) -> None:
        """JSON for programs: indented, keys in the given order, non-ASCII kept, in both modes."""
        self.raw(json.dumps(data, indent=2, ensure_ascii=False) + "\n")

    def line(self, text: str = "", style: str | None = None) -> None:
        """One line of text; `style` applies on a terminal only."""
        if self.rich:
            from rich.text import Text

            self.console.print(Text(text, style=style or ""))
        else:
            self.raw(text + "\n")

    def heading(self, text: str) -> None:
        """A section title: a rule on a terminal, ``== text ==`` when piped."""
        if self.rich:
            from rich.text import Text

            self.console.print()
            self.console.rule(Text(text, style="bold cyan"))
        else:
            self.raw(f"\n== {text} ==\n")

    def code(self, text: str, lexer: str) -> None:
        """A block of source (a rendered prompt), highlighted on a terminal."""
        if self.rich:
            from rich.syntax import Syntax

            self.console.print(Syntax(text, lexer, theme="ansi_dark", word_wrap=True))
        else:
            self.raw(text if text.endswith("\n") else text + "\n")

    def pairs(self, rows: Sequence[tuple[str, str]]) -> None:
        """Labelled values: an aligned grid on a terminal, ``label: value`` lines when piped."""
        if self.rich:
            from rich.table import Table

            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold")
            grid.add_column()
            for label, value in rows:
                grid.add_row(label, value)
            self.console.print(grid)
        else:
            for label, value in rows:
                self.raw(f"{label}: {one_line(value)}\n")

    # --- progress ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def progress(self, what: str) -> Iterator[Callable[[int, int], None]]:
        """A progress bar for a long run, on standard error (results stay on standard output):
        rich's bar on a terminal, else a line at each tenth of the way. Yields the callback
        the run calls with (done, total)."""
        err = sys.stderr
        if self.rich and _isatty(err):
            from rich.console import Console
            from rich.progress import Progress

            with Progress(console=Console(file=err), transient=True) as bar:
                task = bar.add_task(what, total=None)

                def show(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                yield show
            return
        shown = [-1]

        def plain(done: int, total: int) -> None:
            tenth = 10 * done // total if total else 10
            if tenth != shown[0]:
                shown[0] = tenth
                err.write(f"{what}: {done}/{total}\n")
                err.flush()

        yield plain

    # --- tables and trees -----------------------------------------------------------------------

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        title: str | None = None,
        numeric: Sequence[str] = (),
        whole: Sequence[str] | None = None,
    ) -> None:
        """A table: rich on a terminal, tab-separated with a header line when piped.

        Args:
            columns: the column names.
            rows: the cells, as text.
            title: a title above the table (terminal only).
            numeric: columns aligned right.
            whole: columns never shortened on a narrow terminal (ids to copy); by default the
                first column.
        """
        if not self.rich and self.terminal:
            self._aligned(columns, rows, numeric)
            return
        if not self.rich:
            self.raw("\t".join(columns) + "\n")
            for row in rows:
                self.raw("\t".join(one_line(cell) for cell in row) + "\n")
            return
        from rich.table import Table
        from rich.text import Text

        if not rows:
            self.console.print(Text("(none)", style="dim"))
            return
        keep = set(columns[:1] if whole is None else whole)
        widths = [
            max(len(name), *(len(one_line(row[i])) for row in rows))
            for i, name in enumerate(columns)
        ]
        needed = sum(w + 3 for w, name in zip(widths, columns, strict=True) if name in keep)
        needed += sum(_NARROWEST + 3 for name in columns if name not in keep) + 1
        if needed > self.console.width:
            self._records(columns, rows, title)  # too narrow for a table that keeps the ids
            return
        table = Table(title=title, title_style="bold", header_style="bold cyan")
        for index, name in enumerate(columns):
            width = widths[index]
            table.add_column(
                name,
                justify="right" if name in numeric else "left",
                no_wrap=name in keep,
                min_width=width if name in keep else None,
            )
        for row in rows:
            table.add_row(*(self._cell(cell) for cell in row))
        self.console.print(table)

    def _records(
        self, columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None
    ) -> None:
        """One block of `column: value` lines per row, for a terminal too narrow for a table.

        Lines are not wrapped by rich (the terminal wraps them), so an id copies whole.
        """
        from rich.text import Text

        if title:
            self.console.print(Text(title, style="bold"))
        for index, row in enumerate(rows):
            if index:
                self.console.print()
            for name, cell in zip(columns, row, strict=True):
                text = Text()
                text.append(f"{name}: ", style="bold cyan")
                text.append_text(self._cell(cell))
                self.console.print(text, soft_wrap=True)

    def _aligned(
        self, columns: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[str]
    ) -> None:
        """A table in aligned columns, for a terminal without rich (cells are never cut)."""
        if not rows:
            self.raw("(none)\n")
            return
        cells = [list(columns), *([_MARK.sub(r"\1", one_line(c)) for c in row] for row in rows)]
        widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
        for row in cells:
            parts = [
                cell.rjust(width) if name in numeric else cell.ljust(width)
                for cell, width, name in zip(row, widths, columns, strict=True)
            ]
            self.raw("  ".join(parts).rstrip() + "\n")

    @staticmethod
    def _cell(value: str) -> Text:
        """A table cell; `<mark>`…`</mark>` (search hits) shown highlighted."""
        from rich.text import Text

        text = Text()
        last = 0
        for match in _MARK.finditer(value):
            text.append(one_line(value[last : match.start()]))
            text.append(one_line(match.group(1)), style="bold reverse")
            last = match.end()
        text.append(one_line(value[last:]))
        return text

    def graph_tree(self, tree: str) -> None:
        """The ASCII tree of ``visualize_graph``, coloured on a terminal."""
        if not self.rich:
            self.raw(tree + "\n")
            return
        for line in tree.split("\n"):
            self.console.print(self._tree_line(line))

    @staticmethod
    def _tree_line(line: str) -> Text:
        from rich.text import Text

        match = _TREE_LINE.match(line)
        if match is None:
            style = "bold" if line.startswith("[chat:") else "dim"
            return Text(line, style=style)
        text = Text()
        text.append(match["prefix"], style="dim")
        text.append(match["id"], style="cyan")
        role = match["role"]
        text.append(f" ({role}): ", style=_ROLE_STYLES.get(role, ""))
        rest = match["rest"]
        cut = len(rest)
        marks = ""
        if rest.endswith("}") and " {" in rest:
            cut = rest.rindex(" {")
            marks = rest[cut:]
        heads = ""
        if " <- [" in rest[:cut]:
            start = rest.rindex(" <- [", 0, cut)
            heads = rest[start:cut]
            cut = start
        text.append(rest[:cut])
        text.append(heads, style="bold blue")
        text.append(marks, style="bold yellow")
        return text
