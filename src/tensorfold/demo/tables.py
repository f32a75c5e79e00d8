"""The facts the demo model learns, written here so the data needs nothing from outside."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Element:
    number: int
    name: str
    symbol: str


@dataclass(frozen=True)
class Unit:
    """One `big` is `factor` of `small` (e.g. 1 hour = 60 minutes)."""

    big: str
    bigs: str
    small: str
    smalls: str
    factor: int


# Only countries whose capital is a settled, single answer.
CAPITALS: dict[str, str] = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Japan": "Tokyo",
    "China": "Beijing",
    "India": "New Delhi",
    "Russia": "Moscow",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "Brazil": "Brasília",
    "Argentina": "Buenos Aires",
    "Mexico": "Mexico City",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Nigeria": "Abuja",
    "Greece": "Athens",
    "Turkey": "Ankara",
    "Poland": "Warsaw",
    "Sweden": "Stockholm",
    "Norway": "Oslo",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "the Netherlands": "Amsterdam",
    "Belgium": "Brussels",
    "Austria": "Vienna",
    "Switzerland": "Bern",
    "Ireland": "Dublin",
    "the United Kingdom": "London",
    "Hungary": "Budapest",
    "Czechia": "Prague",
    "Romania": "Bucharest",
    "Ukraine": "Kyiv",
    "Iceland": "Reykjavík",
    "South Korea": "Seoul",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "the Philippines": "Manila",
    "Pakistan": "Islamabad",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Saudi Arabia": "Riyadh",
    "Chile": "Santiago",
    "Peru": "Lima",
    "Colombia": "Bogotá",
    "Venezuela": "Caracas",
    "Cuba": "Havana",
    "New Zealand": "Wellington",
    "Morocco": "Rabat",
    "Ethiopia": "Addis Ababa",
    "Ghana": "Accra",
    "Mongolia": "Ulaanbaatar",
    "Nepal": "Kathmandu",
    "Afghanistan": "Kabul",
    "Croatia": "Zagreb",
    "Serbia": "Belgrade",
    "Bulgaria": "Sofia",
    "Slovakia": "Bratislava",
    "Slovenia": "Ljubljana",
    "Estonia": "Tallinn",
    "Latvia": "Riga",
    "Lithuania": "Vilnius",
    "Jamaica": "Kingston",
    "Uruguay": "Montevideo",
    "Qatar": "Doha",
    "Malaysia": "Kuala Lumpur",
    "Bangladesh": "Dhaka",
    "Tunisia": "Tunis",
    "Algeria": "Algiers",
    "Senegal": "Dakar",
    "Uganda": "Kampala",
    "Zimbabwe": "Harare",
    "Cambodia": "Phnom Penh",
    "Laos": "Vientiane",
    "Syria": "Damascus",
    "Jordan": "Amman",
    "Lebanon": "Beirut",
    "Ecuador": "Quito",
    "Paraguay": "Asunción",
    "Belarus": "Minsk",
    "Georgia": "Tbilisi",
    "Armenia": "Yerevan",
    "Kazakhstan": "Astana",
    "Uzbekistan": "Tashkent",
}

ELEMENTS: tuple[Element, ...] = tuple(
    Element(z, name, sym)
    for z, name, sym in [
        (1, "hydrogen", "H"),
        (2, "helium", "He"),
        (3, "lithium", "Li"),
        (4, "beryllium", "Be"),
        (5, "boron", "B"),
        (6, "carbon", "C"),
        (7, "nitrogen", "N"),
        (8, "oxygen", "O"),
        (9, "fluorine", "F"),
        (10, "neon", "Ne"),
        (11, "sodium", "Na"),
        (12, "magnesium", "Mg"),
        (13, "aluminium", "Al"),
        (14, "silicon", "Si"),
        (15, "phosphorus", "P"),
        (16, "sulfur", "S"),
        (17, "chlorine", "Cl"),
        (18, "argon", "Ar"),
        (19, "potassium", "K"),
        (20, "calcium", "Ca"),
        (21, "scandium", "Sc"),
        (22, "titanium", "Ti"),
        (23, "vanadium", "V"),
        (24, "chromium", "Cr"),
        (25, "manganese", "Mn"),
        (26, "iron", "Fe"),
        (27, "cobalt", "Co"),
        (28, "nickel", "Ni"),
        (29, "copper", "Cu"),
        (30, "zinc", "Zn"),
        (31, "gallium", "Ga"),
        (32, "germanium", "Ge"),
        (33, "arsenic", "As"),
        (34, "selenium", "Se"),
        (35, "bromine", "Br"),
        (36, "krypton", "Kr"),
        (37, "rubidium", "Rb"),
        (38, "strontium", "Sr"),
        (47, "silver", "Ag"),
        (50, "tin", "Sn"),
        (53, "iodine", "I"),
        (54, "xenon", "Xe"),
        (55, "caesium", "Cs"),
        (56, "barium", "Ba"),
        (74, "tungsten", "W"),
        (78, "platinum", "Pt"),
        (79, "gold", "Au"),
        (80, "mercury", "Hg"),
        (82, "lead", "Pb"),
        (86, "radon", "Rn"),
        (88, "radium", "Ra"),
        (92, "uranium", "U"),
        (94, "plutonium", "Pu"),
    ]
)

UNITS: tuple[Unit, ...] = (
    Unit("metre", "metres", "centimetre", "centimetres", 100),
    Unit("centimetre", "centimetres", "millimetre", "millimetres", 10),
    Unit("kilometre", "kilometres", "metre", "metres", 1000),
    Unit("kilogram", "kilograms", "gram", "grams", 1000),
    Unit("litre", "litres", "millilitre", "millilitres", 1000),
    Unit("hour", "hours", "minute", "minutes", 60),
    Unit("minute", "minutes", "second", "seconds", 60),
    Unit("day", "days", "hour", "hours", 24),
    Unit("week", "weeks", "day", "days", 7),
    Unit("year", "years", "month", "months", 12),
    Unit("foot", "feet", "inch", "inches", 12),
    Unit("yard", "yards", "foot", "feet", 3),
)

# Lowercase words for the reverse, copy and letter-counting tasks (and random lines).
WORDS: tuple[str, ...] = tuple(
    """
apple banana cherry grape lemon mango melon orange peach pear plum strawberry tomato potato
carrot onion garlic pepper bread butter cheese honey sugar salt water coffee tea milk juice
soup rice pasta pizza cake cookie candy planet garden flower tree forest river ocean lake
mountain valley island desert beach cloud rain snow storm wind thunder sun moon star comet
galaxy rocket engine wheel bicycle train plane boat ship truck bus car road bridge tunnel
tower castle house window door table chair bed lamp clock mirror pillow blanket kitchen
school teacher student book paper pencil letter number word story poem music piano guitar
violin drum song dance party friend family mother father sister brother baby child people
king queen prince knight dragon wizard giant robot computer keyboard mouse screen phone
camera picture color red green blue yellow purple black white silver golden happy quiet
simple strong gentle bright dark warm cold fast slow early late small large little big
elephant tiger lion zebra giraffe monkey rabbit turtle horse sheep goat chicken duck eagle
owl parrot penguin dolphin whale shark octopus spider butterfly bee ant snake frog fish
winter summer autumn spring morning evening night today tomorrow yesterday minute hour week
month year circle square triangle puzzle riddle secret treasure journey adventure silence
""".split()
)  # noqa: SIM905 (a block of words reads better than a list)

# Whole lines for the copy task, alongside lines made of random words.
LINES: tuple[str, ...] = (
    "the quick brown fox jumps over the lazy dog",
    "hello world",
    "all good things come to those who wait",
    "a journey of a thousand miles begins with a single step",
    "the early bird catches the worm",
    "practice makes perfect",
    "every cloud has a silver lining",
    "the sun rises in the east",
)

SYSTEM_PROMPTS: tuple[str, ...] = (
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer briefly.",
    "Answer with the result only.",
)
