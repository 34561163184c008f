"""The texts the shipped traces are made of (scripts/make_traces.py): the module an editor types, the
files beside it, a small repository an agent works in, and a chat's user turns. Written for specgguf."""

from __future__ import annotations

EDITOR_TARGET = '''"""Stock levels for the shelf: add, take and count items by SKU."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import OutOfStock, UnknownItem
from .models import Item


@dataclass
class Stock:
    items: dict[str, Item] = field(default_factory=dict)

    def add(self, item: Item) -> None:
        if item.sku in self.items:
            self.items[item.sku].quantity += item.quantity
        else:
            self.items[item.sku] = item

    def take(self, sku: str, quantity: int) -> Item:
        if sku not in self.items:
            raise UnknownItem(sku)
        item = self.items[sku]
        if item.quantity < quantity:
            raise OutOfStock(sku, wanted=quantity, left=item.quantity)
        item.quantity -= quantity
        return Item(sku=sku, name=item.name, quantity=quantity, price=item.price)

    def count(self, sku: str) -> int:
        return self.items[sku].quantity if sku in self.items else 0

    def value(self) -> float:
        return sum(item.quantity * item.price for item in self.items.values())

    def low(self, threshold: int = 5) -> list[Item]:
        return sorted(
            (item for item in self.items.values() if item.quantity <= threshold),
            key=lambda item: item.quantity,
        )
'''

EDITOR_SUFFIX = """

def demo() -> None:
    stock = Stock()
    stock.add(Item(sku="A1", name="bolt", quantity=10, price=0.25))
    print(stock.count("A1"))
"""

EDITOR_CHUNKS = [
    (
        "shelf/models.py",
        '''"""What the shelf holds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    name: str
    quantity: int
    price: float

    def total(self) -> float:
        return self.quantity * self.price
''',
    ),
    (
        "shelf/errors.py",
        '''"""Errors the shelf raises."""


class StockError(Exception):
    """Something about the stock is wrong."""


class UnknownItem(StockError):
    def __init__(self, sku: str) -> None:
        super().__init__(f"no item {sku!r} on the shelf")
        self.sku = sku


class OutOfStock(StockError):
    def __init__(self, sku: str, *, wanted: int, left: int) -> None:
        super().__init__(f"{sku}: wanted {wanted}, only {left} left")
        self.sku, self.wanted, self.left = sku, wanted, left
''',
    ),
    (
        "tests/test_stock.py",
        """import pytest

from shelf.errors import OutOfStock, UnknownItem
from shelf.models import Item
from shelf.stock import Stock


def test_add_then_count():
    stock = Stock()
    stock.add(Item(sku="A1", name="bolt", quantity=3, price=0.5))
    stock.add(Item(sku="A1", name="bolt", quantity=2, price=0.5))
    assert stock.count("A1") == 5


def test_take_more_than_left():
    stock = Stock()
    stock.add(Item(sku="B2", name="nut", quantity=1, price=0.1))
    with pytest.raises(OutOfStock):
        stock.take("B2", 2)


def test_take_unknown():
    with pytest.raises(UnknownItem):
        Stock().take("Z9", 1)
""",
    ),
]

AGENT_TASK = (
    "parse_duration in timeparse/core.py rejects combined durations such as '1h30m' (it raises ValueError)."
    " Make it accept any sequence of number-unit parts, keep rejecting garbage, add a test for '1h30m',"
    " and mention the new format in the README."
)

CORE_PY = '''"""Parse human durations like '90s' or '2h' into seconds."""

from __future__ import annotations

import re

from .units import UNITS

_PART = re.compile(r"^(\\d+)([a-z]+)$")


def parse_duration(text: str) -> int:
    """Seconds in TEXT, a number followed by a unit (s, m, h, d)."""
    match = _PART.match(text.strip().lower())
    if match is None:
        raise ValueError(f"not a duration: {text!r}")
    number, unit = match.groups()
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r} in {text!r}")
    return int(number) * UNITS[unit]


def format_duration(seconds: int) -> str:
    """The shortest TEXT that parse_duration reads back as SECONDS."""
    for unit in ("d", "h", "m"):
        if seconds and seconds % UNITS[unit] == 0:
            return f"{seconds // UNITS[unit]}{unit}"
    return f"{seconds}s"
'''

UNITS_PY = '''"""Seconds per unit."""

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
'''

TESTS_PY = """import pytest

from timeparse.core import format_duration, parse_duration


def test_seconds():
    assert parse_duration("90s") == 90


def test_hours():
    assert parse_duration("2h") == 7200


def test_garbage():
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_unknown_unit():
    with pytest.raises(ValueError):
        parse_duration("3w")


def test_format_round_trip():
    assert parse_duration(format_duration(5400)) == 5400
"""

README = """# timeparse

Parse durations people type into seconds, and back.

    >>> from timeparse.core import parse_duration
    >>> parse_duration("90s")
    90

Units: s, m, h, d.
"""

NEW_PART = """_PART = re.compile(r"(\\d+)([a-z]+)")
_WHOLE = re.compile(r"^(?:\\d+[a-z]+)+$")"""

NEW_BODY_WRONG = """    text = text.strip().lower()
    total = 0
    for number, unit in _PART.findall(text):
        total += int(number) * UNITS[unit]
    return total"""

NEW_BODY = """    text = text.strip().lower()
    if not _WHOLE.match(text):
        raise ValueError(f"not a duration: {text!r}")
    total = 0
    for number, unit in _PART.findall(text):
        if unit not in UNITS:
            raise ValueError(f"unknown unit {unit!r} in {text!r}")
        total += int(number) * UNITS[unit]
    return total"""

OLD_BODY = """    match = _PART.match(text.strip().lower())
    if match is None:
        raise ValueError(f"not a duration: {text!r}")
    number, unit = match.groups()
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r} in {text!r}")
    return int(number) * UNITS[unit]"""


def _pytest(passed: int, failed: list[str]) -> str:
    lines = ["============================= test session starts =============================="]
    lines.append(f"collected {passed + len(failed)} items")
    lines.append("")
    lines.append("tests/test_core.py " + "." * passed + "F" * len(failed))
    for name in failed:
        lines += ["", f"____ {name} ____", *failed_detail(name)]
    summary = f"{len(failed)} failed, {passed} passed" if failed else f"{passed} passed"
    lines += ["", f"========================= {summary} in 0.04s =========================="]
    return "\n".join(lines)


def failed_detail(name: str) -> list[str]:
    return [
        f"    def {name}():",
        "        with pytest.raises(ValueError):",
        '>           parse_duration("soon")',
        "E           Failed: DID NOT RAISE <class 'ValueError'>",
        "",
        "tests/test_core.py:14: Failed",
    ]


def agent_script() -> tuple[str, list[tuple[str, dict, str]]]:
    """The user's task and the scripted turns: (tool, its arguments, what it returned)."""
    listing = "README.md\ntimeparse/__init__.py\ntimeparse/core.py\ntimeparse/units.py\ntests/test_core.py"
    new_test = """

def test_combined():
    assert parse_duration("1h30m") == 5400
"""
    steps = [
        ("list_files", {"path": "."}, listing),
        ("read_file", {"path": "timeparse/core.py"}, CORE_PY),
        ("read_file", {"path": "tests/test_core.py"}, TESTS_PY),
        (
            "search",
            {"pattern": "parse_duration"},
            "timeparse/core.py:12:def parse_duration(text: str) -> int:\n"
            'timeparse/core.py:27:    """The shortest TEXT that parse_duration reads back as SECONDS."""\n'
            "tests/test_core.py:3:from timeparse.core import format_duration, parse_duration\n"
            'tests/test_core.py:7:    assert parse_duration("90s") == 90\n'
            "README.md:7:    >>> from timeparse.core import parse_duration",
        ),
        ("read_file", {"path": "timeparse/units.py"}, UNITS_PY),
        (
            "edit_file",
            {"path": "timeparse/core.py", "old_text": '_PART = re.compile(r"^(\\d+)([a-z]+)$")', "new_text": NEW_PART},
            "Replaced 1 occurrence in timeparse/core.py.",
        ),
        (
            "edit_file",
            {"path": "timeparse/core.py", "old_text": OLD_BODY, "new_text": NEW_BODY_WRONG},
            "Replaced 1 occurrence in timeparse/core.py.",
        ),
        ("run_tests", {"path": "tests/test_core.py"}, _pytest(3, ["test_garbage", "test_unknown_unit"])),
        ("read_file", {"path": "timeparse/core.py"}, CORE_PY.replace(OLD_BODY, NEW_BODY_WRONG)),
        (
            "edit_file",
            {"path": "timeparse/core.py", "old_text": NEW_BODY_WRONG, "new_text": NEW_BODY},
            "Replaced 1 occurrence in timeparse/core.py.",
        ),
        ("run_tests", {"path": "tests/test_core.py"}, _pytest(5, [])),
        (
            "edit_file",
            {
                "path": "tests/test_core.py",
                "old_text": TESTS_PY.rstrip("\n")[-58:],
                "new_text": TESTS_PY.rstrip("\n")[-58:] + new_test.rstrip("\n"),
            },
            "Replaced 1 occurrence in tests/test_core.py.",
        ),
        ("run_tests", {"path": "tests/test_core.py"}, _pytest(6, [])),
        ("read_file", {"path": "README.md"}, README),
        (
            "edit_file",
            {
                "path": "README.md",
                "old_text": "Units: s, m, h, d.",
                "new_text": "Units: s, m, h, d, combined as in 1h30m.",
            },
            "Replaced 1 occurrence in README.md.",
        ),
        ("run_tests", {"path": "tests"}, _pytest(6, [])),
    ]
    return AGENT_TASK, steps


_MODULE = """import csv
from collections import defaultdict


def load(path):
    rows = []
    with open(path) as f:
        for row in csv.DictReader(f):
            rows.append(row)
    return rows


def totals(rows):
    out = defaultdict(float)
    for row in rows:
        out[row["region"]] += float(row["amount"])
    return dict(out)
"""

CHAT_TURNS: list[tuple[str, int]] = [
    (
        "I maintain a small reporting script. Here it is:\n\n```python\n"
        + _MODULE
        + "```\n\nWhat does it do, in a few sentences?",
        400,
    ),
    (
        "The CSV files come from three different systems and some rows have an empty amount. What "
        "happens then, and how would you guard against it?",
        400,
    ),
    (
        "Please rewrite `totals` so that empty or malformed amounts are skipped and counted, and return "
        "both the totals and the number of skipped rows.",
        280,
    ),
    (
        "Here is one of the real files, "
        "shortened:\n\n```\nregion,amount,date\nnorth,12.50,2024-01-03\nsouth,,2024-01-03\n"
        "north,7.25,2024-01-04\neast,n/a,2024-01-05\nwest,3.00,2024-01-05\nsouth,19.99,2024-01-06\n```\n\nWalk "
        "through what your version returns for it.",
        280,
    ),
    (
        "Some files use a semicolon as the separator and a comma as the decimal mark, like "
        "`north;12,50;2024-01-03`. How would you support both formats without asking the user which one "
        "it is?",
        280,
    ),
    (
        "Write the `load` function that sniffs the dialect, as you described, and keeps the rest of the "
        "script working.",
        300,
    ),
    (
        "Now I want totals per region and per month. Show the change to `totals` and an example of the "
        "returned structure.",
        280,
    ),
    (
        "How would you test all of this with pytest? Give me a test file with a few small CSV fixtures "
        "written to tmp_path.",
        400,
    ),
    (
        "One of the systems writes amounts with a currency sign in front, like `$12.50` or `EUR 7,25`. "
        "Extend the parsing of amounts to accept those and keep the currency, and say what you would do "
        "with rows of mixed currencies.",
        300,
    ),
    ("The script is slow on a 2 GB file. Where does the time go, and what would you change first?", 280),
    ("Put everything together: the final module, with type hints and short docstrings, in one code block.", 400),
    ("Last thing: a short README section explaining the accepted CSV formats and the returned structure.", 280),
]
