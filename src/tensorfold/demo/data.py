"""Chat tasks with one right answer, for training and testing the bundled demo model.

Every family is a constructor taking explicit arguments (so fixed prompts and random ones come
from the same code) plus a sampler drawing those arguments from a seeded `random.Random`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from .tables import CAPITALS, ELEMENTS, LINES, SYSTEM_PROMPTS, UNITS, WORDS, Element, Unit

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
KNOWN_RATE = 0.01  # share of samples drawn from KNOWN_ANSWERS
THINKING_RATE = 0.5
SYSTEM_RATE = 0.1


@dataclass(frozen=True)
class Task:
    prompt: str
    answer: str
    trace: str
    family: str = ""


@dataclass(frozen=True)
class Sample:
    """A task as one chat turn: the prompt the template renders, the reply the model learns."""

    task: Task
    thinking: bool
    system: str | None = None

    def prompt_text(self) -> str:
        """Exactly the chat template's output with add_generation_prompt and enable_thinking."""
        head = f"{IM_START}system\n{self.system}{IM_END}\n" if self.system is not None else ""
        opening = f"{THINK_OPEN}\n" if self.thinking else f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"
        return f"{head}{IM_START}user\n{self.task.prompt}{IM_END}\n{IM_START}assistant\n{opening}"

    def completion_text(self) -> str:
        trace = f"{self.task.trace}\n{THINK_CLOSE}\n\n" if self.thinking else ""
        return f"{trace}{self.task.answer}{IM_END}"


def _spell(word: str) -> str:
    return " ".join(word)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def add_task(a: int, b: int, form: int = 0) -> Task:
    prompt = ("What is {} + {}?", "Compute {} + {}.", "{} + {} = ?")[form].format(a, b)
    steps, carry, da, db = [], 0, str(a)[::-1], str(b)[::-1]
    for i in range(max(len(da), len(db))):
        terms = [d[i] for d in (da, db) if i < len(d)] + ([str(carry)] if carry else [])
        total = sum(int(t) for t in terms)
        last = i == max(len(da), len(db)) - 1
        carry, digit = divmod(total, 10)
        step = f"{' + '.join(terms)} = {total}, write {total if last else digit}"
        steps.append(step + (f", carry {carry}" if carry and not last else ""))
    trace = f"{'; '.join(steps)}. So {a} + {b} = {a + b}."
    return Task(prompt, str(a + b), trace, "add")


def _places(n: int) -> list[int]:
    """Non-zero place parts, largest first: 405 -> [400, 5]."""
    s = str(n)
    parts = [int(d) * 10 ** (len(s) - i - 1) for i, d in enumerate(s)]
    return [p for p in parts if p] or [0]


def _product_trace(a: int, b: int) -> str:
    """Split the longer factor into place parts (the second one when both have two digits)."""
    if a < 10 and b < 10:
        return f"{a} × {b} = {a * b}."
    if b < 10:
        terms = [(x, b) for x in _places(a)]
    else:
        terms = [(a, x) for x in (_places(b) if a < 10 else (b - b % 10, b % 10)) if x]
    if len(terms) == 1:
        return f"{a} × {b} = {a * b}."
    products = " + ".join(f"{x} × {y}" for x, y in terms)
    values = " + ".join(str(x * y) for x, y in terms)
    return f"{a} × {b} = {products} = {values} = {a * b}."


def mul_task(a: int, b: int, form: int = 0) -> Task:
    prompt = ("What is {} × {}?", "Compute {} × {}.", "{} × {} = ?")[form].format(a, b)
    return Task(prompt, str(a * b), _product_trace(a, b), "mul")


def reverse_word_task(word: str, form: int = 0) -> Task:
    prompt = ("Reverse the word {}.", "Spell {} backwards.", "Write {} backwards.")[form]
    back = word[::-1]
    trace = f"{_spell(word)}. Backwards: {_spell(back)}."
    return Task(prompt.format(word), back, trace, "reverse_word")


def copy_word_task(word: str, form: int = 0) -> Task:
    prompt = ("Repeat the word {}.", "Copy the word {}.", "Write the word {}.")[form]
    return Task(prompt.format(word), word, f"The word is {word}.", "copy_word")


def copy_line_task(line: str, form: int = 0) -> Task:
    prompt = ("Copy this line: {}", "Repeat this line exactly: {}")[form].format(line)
    trace = f"The line has {len(line.split())} words."
    return Task(prompt, line, trace, "copy_line")


def reverse_line_task(line: str, form: int = 0) -> Task:
    prompt = ("Reverse the order of the words: {}", "Write these words in reverse order: {}")
    words = line.split()
    trace = f"Words: {', '.join(words)}. Reversed: {', '.join(words[::-1])}."
    return Task(prompt[form].format(line), " ".join(words[::-1]), trace, "reverse_line")


def count_letter_task(word: str, letter: str, form: int = 0) -> Task:
    prompt = ("How many times does the letter {} appear in {}?", "Count the letter {} in {}.")
    n = word.count(letter)
    found = " ".join([letter] * n) if n else "none"
    trace = f"{_spell(word)}. Found: {found}. Total: {n}."
    return Task(prompt[form].format(letter, word), str(n), trace, "count_letter")


def word_length_task(word: str, form: int = 0) -> Task:
    prompt = ("How many letters are in {}?", "How many letters does {} have?")[form]
    numbered = " ".join(f"{ch}{i}" for i, ch in enumerate(word, 1))
    trace = f"{numbered}. Total: {len(word)}."
    return Task(prompt.format(word), str(len(word)), trace, "word_length")


def capital_task(country: str, form: int = 0) -> Task:
    capital = CAPITALS[country]
    trace = f"The capital of {country} is {capital}."
    if form == 2:
        return Task(f"{capital} is the capital of which country?", _cap(country), trace, "capital")
    prompt = ("What is the capital of {}?", "Name the capital city of {}.")[form]
    return Task(prompt.format(country), capital, trace, "capital")


def element_task(element: Element, form: int = 0) -> Task:
    name, sym, z = _cap(element.name), element.symbol, element.number
    trace = f"{name} is element {z}. Its symbol is {sym}."
    prompts = (
        (f"What is the chemical symbol for {element.name}?", sym),
        (f"What is the symbol of {element.name}?", sym),
        (f"Which element has the symbol {sym}?", name),
        (f"What is the atomic number of {element.name}?", str(z)),
    )
    prompt, answer = prompts[form]
    return Task(prompt, answer, trace, "element")


def _leap_reason(year: int) -> tuple[bool, str]:
    if year % 400 == 0:
        return True, f"{year} is divisible by 400, so it is a leap year"
    if year % 100 == 0:
        return False, f"{year} is divisible by 100 but not by 400, so it is not a leap year"
    if year % 4 == 0:
        return True, f"{year} is divisible by 4 and not by 100, so it is a leap year"
    return False, f"{year} is not divisible by 4, so it is not a leap year"


def year_task(year: int | None, form: int = 0) -> Task:
    """form 0: days in `year`; 1: is it a leap year. year None: days in a leap (form 0) or
    common (form 1) year."""
    if year is None:
        days, kind = (366, "leap") if form == 0 else (365, "common")
        trace = f"A {kind} year has {days} days."
        return Task(f"How many days are in a {kind} year?", str(days), trace, "year")
    leap, reason = _leap_reason(year)
    days = 366 if leap else 365
    if form == 1:
        return Task(f"Is {year} a leap year?", "Yes" if leap else "No", f"{reason}.", "year")
    prompt = f"How many days are in the year {year}?"
    return Task(prompt, str(days), f"{reason}: {days} days.", "year")


def _qty(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def unit_task(unit: Unit, n: int, form: int = 0) -> Task:
    """form 0: big -> small ("minutes in 3 hours"); 1: small -> big ("hours in 180 minutes")."""
    u, m = unit, n * unit.factor
    rule = f"1 {u.big} = {_qty(u.factor, u.small, u.smalls)}"
    if form == 1:
        prompt = f"How many {u.bigs} are in {_qty(m, u.small, u.smalls)}?"
        trace = f"{rule}, so {m} ÷ {u.factor} = {_qty(n, u.big, u.bigs)}."
        return Task(prompt, str(n), trace, "unit")
    prompt = f"How many {u.smalls} are in {_qty(n, u.big, u.bigs)}?"
    trace = f"{rule}, so {n} × {u.factor} = {_qty(m, u.small, u.smalls)}."
    return Task(prompt, str(m), trace, "unit")


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


def _sample_add(rng: random.Random) -> Task:
    da, db = rng.choice((1, 2, 2, 3, 3, 3)), rng.choice((1, 2, 2, 3, 3, 3))
    return add_task(_number(rng, da), _number(rng, db), rng.randrange(3))


def _sample_mul(rng: random.Random) -> Task:
    kind = rng.random()
    if kind < 0.5:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
    elif kind < 0.9:
        a, b = rng.randint(10, 99 if kind < 0.7 else 999), rng.randint(2, 9)
        a, b = (b, a) if rng.random() < 0.3 else (a, b)
    else:
        a, b = rng.randint(0, 12), rng.randint(0, 12)
    return mul_task(a, b, rng.randrange(3))


def _line(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return rng.choice(LINES)
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))


def _sample_count(rng: random.Random) -> Task:
    word = rng.choice(WORDS)
    letter = rng.choice(word) if rng.random() < 0.7 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    return count_letter_task(word, letter, rng.randrange(2))


def _sample_year(rng: random.Random) -> Task:
    if rng.random() < 0.08:
        return year_task(None, rng.randrange(2))
    year = rng.randrange(1600, 2401, 100) if rng.random() < 0.15 else rng.randint(1600, 2400)
    return year_task(year, rng.randrange(2))


def _sample_unit(rng: random.Random) -> Task:
    n = rng.randint(1, 12) if rng.random() < 0.8 else rng.randint(13, 30)
    return unit_task(rng.choice(UNITS), n, rng.randrange(2))


Sampler = Callable[[random.Random], Task]
FAMILIES: dict[str, tuple[float, Sampler]] = {
    "add": (0.12, _sample_add),
    "mul": (0.18, _sample_mul),
    "reverse_word": (0.09, lambda r: reverse_word_task(r.choice(WORDS), r.randrange(3))),
    "copy_word": (0.03, lambda r: copy_word_task(r.choice(WORDS), r.randrange(3))),
    "copy_line": (0.06, lambda r: copy_line_task(_line(r), r.randrange(2))),
    "reverse_line": (0.07, lambda r: reverse_line_task(_line(r), r.randrange(2))),
    "count_letter": (0.08, _sample_count),
    "word_length": (0.05, lambda r: word_length_task(r.choice(WORDS), r.randrange(2))),
    "capital": (0.10, lambda r: capital_task(r.choice(sorted(CAPITALS)), r.choice((0, 0, 1, 2)))),
    "element": (0.08, lambda r: element_task(r.choice(ELEMENTS), r.choice((0, 0, 1, 2, 3)))),
    "year": (0.07, _sample_year),
    "unit": (0.07, _sample_unit),
}

_ELEMENT = {e.name: e for e in ELEMENTS}
_UNIT = {u.big: u for u in UNITS}

# Fixed prompts with their exact answers, one or more per family; the training mix repeats them.
KNOWN_ANSWERS: tuple[Task, ...] = (
    capital_task("France"),
    capital_task("Japan"),
    mul_task(17, 23),
    mul_task(123, 4),
    add_task(456, 789),
    reverse_word_task("planet"),
    copy_word_task("garden"),
    copy_line_task("the quick brown fox jumps over the lazy dog"),
    reverse_line_task("red green blue"),
    count_letter_task("strawberry", "r"),
    word_length_task("elephant"),
    element_task(_ELEMENT["iron"]),
    element_task(_ELEMENT["sodium"], form=2),
    year_task(None, form=0),
    year_task(2024),
    year_task(1900, form=1),
    unit_task(_UNIT["hour"], 3),
    unit_task(_UNIT["metre"], 5),
)


def _family_sampler(rng: random.Random) -> Sampler:
    names = list(FAMILIES)
    weights = [FAMILIES[n][0] for n in names]
    return FAMILIES[rng.choices(names, weights)[0]][1]


def sample_task(rng: random.Random, known_rate: float = KNOWN_RATE) -> Task:
    if rng.random() < known_rate:
        return rng.choice(KNOWN_ANSWERS)
    return _family_sampler(rng)(rng)


def generate(seed: int, n: int, known_rate: float = KNOWN_RATE) -> list[Sample]:
    """n samples, a pure function of (seed, n, known_rate)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = sample_task(rng, known_rate)
        thinking = rng.random() < THINKING_RATE
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < SYSTEM_RATE else None
        out.append(Sample(task, thinking, system))
    return out


def corpus(samples: list[Sample]) -> list[str]:
    """Training text for the tokenizer: every prompt and reply, control tokens included."""
    return [s.prompt_text() + s.completion_text() for s in samples]
