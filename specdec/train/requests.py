"""Chat requests for self-distillation: many, varied, offline, and never the evaluation text.

A chat model's drafter serves replies to requests, so its training data is the
model's own replies to requests (Medusa-2 and EAGLE self-distil from chat
prompts in the same spirit). Two sources, both on the machine, no download:

1. Templates x topics: a task ("Explain {topic} in simple terms.", "Write a
   short poem about {topic}.", "Compare {a} and {b}.", how-to, e-mails, code
   questions in three languages, ...) crossed with hand-written topic lists.
2. Python's standard library: the first paragraph of the docstring of each
   public module, class and function, read from the source files with `ast`
   (nothing is imported, so nothing runs), turned into "Explain ..." /
   "Summarise ..." requests. Files the stdlib model family holds out
   (checkpoints/family.is_held_out) are skipped.

`build_requests(seed)` gives the same list, in the same order, for the same seed
(on the same Python: the stdlib's docstrings are part of the input, and the
pool's sha256 is recorded so that a resumed run can tell). Every request that
shares a normalised word 8-gram with the evaluation text (the prompt suite,
specdec/bench/prompts.json, and the family's held-out prompts) is dropped, and
`overlap` is checked again on what is kept: see `EvalOverlap`.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import re
import sysconfig
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

OVERLAP_N = 8  # word n-grams shared with evaluation text that make a request "overlapping"

# ---------------------------------------------------------------------------
# 1. Templates x topics.
# ---------------------------------------------------------------------------

# Things one can explain, summarise, list facts about, write about: a few per field.
TOPICS = """
photosynthesis, gravity, volcanoes, earthquakes, the water cycle, black holes, the solar system, the Moon's phases,
plate tectonics, climate change, the greenhouse effect, ocean tides, rainbows, lightning, magnetism, electricity,
atoms, chemical bonds, DNA, evolution, the immune system, vaccines, the human heart, sleep, memory, dreams,
bacteria, viruses, antibiotics, the brain, muscles, digestion, nutrition, vitamins, exercise, stress,
the Roman Empire, ancient Egypt, the Renaissance, the Industrial Revolution, the printing press, the Silk Road,
the French Revolution, the Cold War, the Moon landing, the invention of the telephone, the history of aviation,
the Olympic Games, democracy, taxes, inflation, interest rates, the stock market, supply and demand,
international trade, banking, budgeting, saving for retirement, renewable energy, solar panels, wind turbines,
nuclear power, electric cars, recycling, plastic pollution, deforestation, coral reefs, rainforests, deserts,
honeybees, ants, whales, dolphins, octopuses, elephants, wolves, migrating birds, penguins, dinosaurs,
the internet, email, search engines, smartphones, GPS, cloud computing, cybersecurity, passwords, encryption,
artificial intelligence, machine learning, robots, 3D printing, video games, social media, online privacy,
databases, operating systems, open-source software, programming languages, compilers, computer memory,
the history of computers, music theory, jazz, classical music, learning a musical instrument, painting,
photography, film making, poetry, theatre, museums, architecture, bridges, skyscrapers, public transport,
trains, bicycles, sailing, gardening, composting, baking bread, coffee, tea, chocolate, cheese making,
fermentation, spices, vegetarian cooking, healthy breakfasts, meal planning, time management, procrastination,
public speaking, job interviews, teamwork, leadership, negotiation, learning a new language, reading habits,
writing a resume, starting a small business, customer service, marketing, friendship, kindness, gratitude,
mindfulness, meditation, happiness, curiosity, critical thinking, the scientific method, statistics,
probability, prime numbers, fractions, geometry, algebra, calculus, infinity, chess, board games, football,
basketball, tennis, running a marathon, swimming, yoga, hiking, camping, mountains, rivers, islands,
the Arctic, the Sahara, the Amazon river, the Great Wall of China, the Eiffel Tower, city parks, libraries,
volunteering, elections, human rights, the United Nations, maps, time zones, calendars, clocks, weather forecasts,
hurricanes, snow, seasons, the speed of light, sound waves, telescopes, microscopes, satellites, Mars,
the International Space Station, rockets, the Big Bang, stars, comets, friendship between animals, pets,
cats, dogs, horses, owls, butterflies, trees, mushrooms, flowers, seeds, soil, farming, irrigation, fishing
"""

EXPLAIN = [
    "Explain {topic} in simple terms.",
    "Can you explain {topic} to a ten-year-old?",
    "What is the most important thing to know about {topic}?",
    "Give me a short overview of {topic}.",
    "List five interesting facts about {topic}.",
    "What are common misconceptions about {topic}?",
    "Summarise what people should know about {topic} in three sentences.",
    "Why does {topic} matter?",
    "Write a short story that involves {topic}.",
    "Write a short poem about {topic}.",
    "Write a haiku about {topic}.",
    "Give me three questions to test someone's understanding of {topic}, with answers.",
    "What are the pros and cons of learning about {topic} at school?",
    "Describe {topic} in one paragraph.",
    "Define {topic} and give an example.",
    "Write a tweet-length fact about {topic}.",
]
COMPARE = ["Compare {a} and {b}.", "What do {a} and {b} have in common, and how do they differ?"]

HOW_TO = """
boil an egg, make a cup of tea, tie a tie, change a flat tyre, plant a tree, write a thank-you note,
prepare for an exam, fall asleep faster, save money on groceries, clean a laptop keyboard, start running,
learn to juggle, make pancakes, organise a small closet, back up my photos, set up a home Wi-Fi network,
choose a good password, write a clear email, give constructive feedback, make friends in a new city,
train a puppy, keep houseplants alive, fold a paper airplane, read a map, pack for a weekend trip,
make a simple budget, study for a math test, stay focused while working from home, make a good first impression,
cook rice, make a salad dressing, brew coffee with a French press, remove a coffee stain, sharpen a knife,
paint a room, hang a picture, build a birdhouse, start a journal, memorise a poem, prepare a short speech,
apologise sincerely, plan a birthday party, learn the guitar chords, take better phone photos, stretch after exercise,
reduce screen time, drink more water, start a vegetable garden, compost kitchen scraps, fix a leaky tap
"""
HOW_TO_TEMPLATES = ["How do I {task}?", "Give me step-by-step instructions to {task}.", "What are some tips to {task}?"]

EMAILS = """
ask my manager for a day off, thank a colleague for their help, invite the team to a lunch,
apologise to a customer for a late delivery, ask a professor for an extension, follow up after a job interview,
decline a meeting politely, welcome a new team member, remind a friend about money they owe me,
request a refund for a broken product, congratulate a friend on a new job, ask a neighbour to keep the noise down,
propose a new project idea to my team, cancel a subscription, announce an office move, ask for feedback on a report,
introduce two colleagues to each other, confirm a dentist appointment, ask a landlord to fix the heating,
invite a speaker to a school event
"""
EMAIL_TEMPLATES = ["Write a short email to {task}.", "Write a polite and friendly message to {task}."]

CODE_TASKS = """
reverse a string, check whether a number is prime, compute the factorial of a number, find the largest element
of a list, count the words in a sentence, remove duplicates from a list, read a text file line by line,
sort a list of dictionaries by a key, check whether a word is a palindrome, compute Fibonacci numbers,
merge two sorted lists, convert Celsius to Fahrenheit, find the most common element of a list,
flatten a nested list, compute the average of a list of numbers, validate an email address, capitalise every word,
count the vowels in a string, generate a random password, compute the greatest common divisor,
implement binary search, implement a stack, implement a queue, swap two variables, check whether two strings are
anagrams, sum the digits of a number, convert a number to binary, find the second largest number,
parse a date string, write a simple calculator
"""
LANGUAGES = ["Python", "JavaScript", "C"]
CODE_TEMPLATES = [
    "Write a {lang} function to {task}.",
    "How do I {task} in {lang}? Show a short example.",
    "Explain how to {task} in {lang}, step by step.",
]


def split_list(text: str) -> list[str]:
    """A comma-separated list, trimmed, empties dropped.

    NOTE: a line break is a space, not a separator: an item may wrap onto the next line.
    """
    return [" ".join(item.split()) for item in text.split(",") if item.strip()]


def templated_requests() -> list[str]:
    """Every templated request: tasks x topics, topic pairs, how-to, e-mails, code questions."""
    topics = split_list(TOPICS)
    out = [t.format(topic=topic) for topic in topics for t in EXPLAIN]
    # Pairs of neighbours in the list (same field, usually): 2 templates x (n - 1) pairs.
    out += [t.format(a=a, b=b) for a, b in itertools.pairwise(topics) for t in COMPARE]
    out += [t.format(task=task) for task in split_list(HOW_TO) for t in HOW_TO_TEMPLATES]
    out += [t.format(task=task) for task in split_list(EMAILS) for t in EMAIL_TEMPLATES]
    out += [
        t.format(task=task, lang=lang) for task in split_list(CODE_TASKS) for lang in LANGUAGES for t in CODE_TEMPLATES
    ]
    return [r[0].upper() + r[1:] for r in out]


# ---------------------------------------------------------------------------
# 2. Python's standard library docstrings.
# ---------------------------------------------------------------------------

DOC_TEMPLATES = [
    "Explain what the Python {kind} `{name}` does. Its documentation says:\n\n{doc}",
    "Summarise this documentation of Python's `{name}` in plain words:\n\n{doc}",
    "Here is the docstring of `{name}` from Python's standard library:\n\n{doc}\n\nExplain it with a short example.",
]
SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "idlelib",
    "turtledemo",
    "site-packages",
    "lib2to3",
    "ensurepip",
    "__pycache__",
    "tkinter",
    "pydoc_data",
    "config-3",
}


def first_paragraph(doc: str | None, min_chars: int = 60, max_chars: int = 600) -> str | None:
    """The docstring's first paragraph on one line, when it is between min_chars and max_chars long."""
    if not doc:
        return None
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    return paragraph if min_chars <= len(paragraph) <= max_chars else None


def stdlib_docs(root: Path | None = None) -> list[tuple[str, str, str]]:
    """(kind, dotted name, first paragraph) of every public module, class and function docstring in the stdlib."""
    from ..checkpoints.family import is_held_out

    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        parts = relative.split("/")
        if any(p in SKIP_DIRS or p.startswith(("_", "config-")) and p != "__init__.py" for p in parts):
            continue
        if is_held_out(relative):  # the stdlib family's held-out files stay unseen
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        module = relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        if doc := first_paragraph(ast.get_docstring(tree)):
            found.append(("module", module, doc))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if doc := first_paragraph(ast.get_docstring(node)):
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    found.append((kind, f"{module}.{node.name}", doc))
    return found


def doc_requests(docs: list[tuple[str, str, str]]) -> list[str]:
    """One request per docstring, the template chosen by its place in the list (all three get used)."""
    return [
        DOC_TEMPLATES[i % len(DOC_TEMPLATES)].format(kind=kind, name=name, doc=doc)
        for i, (kind, name, doc) in enumerate(docs)
    ]


# ---------------------------------------------------------------------------
# 3. Keeping evaluation text out: word n-gram overlap.
# ---------------------------------------------------------------------------


def words(text: str) -> list[str]:
    """Normalised words: lower case, letters and digits only (punctuation and spacing do not hide a copy)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int = OVERLAP_N) -> set[tuple[str, ...]]:
    """Its word n-grams; a text of fewer than n words is one "n-gram" of all its words."""
    w = words(text)
    if len(w) < n:
        return {tuple(w)} if w else set()
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def eval_texts() -> list[str]:
    """Every evaluation text: the prompt suites' prompts (prompts.json, chat_tasks.json) and the stdlib family's
    held-out prompts."""
    texts = []
    for name in ("prompts.json", "chat_tasks.json"):
        suite = json.loads(resources.files("specdec.bench").joinpath(name).read_text(encoding="utf-8"))
        texts += [p for category in suite["categories"].values() for p in category["prompts"]]
    family = json.loads(resources.files("specdec.checkpoints").joinpath("weights/prompts.json").read_text("utf-8"))
    return texts + [p["text"] for p in family]


@dataclass(frozen=True)
class EvalOverlap:
    """What `overlap` found: requests sharing an n-gram (or all their words) with evaluation text."""

    n: int  # the n of the word n-grams compared
    exact: list[int]  # indices of requests equal to an evaluation text (after normalising)
    shared: list[int]  # indices of requests sharing at least one n-gram with one

    def __bool__(self) -> bool:
        return bool(self.exact or self.shared)


def overlap(requests: list[str], evaluation: list[str], n: int = OVERLAP_N) -> EvalOverlap:
    """Which requests repeat evaluation text: equal after normalising, or sharing a word n-gram."""
    eval_grams = set().union(*(ngrams(t, n) for t in evaluation)) if evaluation else set()
    eval_whole = {" ".join(words(t)) for t in evaluation}
    exact = [i for i, r in enumerate(requests) if " ".join(words(r)) in eval_whole]
    shared = [i for i, r in enumerate(requests) if ngrams(r, n) & eval_grams]
    return EvalOverlap(n, exact, shared)


# ---------------------------------------------------------------------------
# The pool.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestPool:
    """The requests, in generation order, and what was dropped to build them."""

    requests: list[str]
    n_templated: int  # distinct templated requests before the overlap filter
    n_docs: int  # distinct docstring requests before the overlap filter
    dropped: list[str]  # requests dropped for overlapping evaluation text

    @property
    def sha256(self) -> str:
        return hashlib.sha256("\x00".join(self.requests).encode()).hexdigest()


def build_requests(seed: int, evaluation: list[str] | None = None, docs=None) -> RequestPool:
    """Every distinct request, less those overlapping `evaluation` (default: eval_texts()), shuffled by seed.

    Raises AssertionError if a request still overlaps after the filter (the check run at build time).
    """
    evaluation = eval_texts() if evaluation is None else evaluation
    templated = sorted(set(templated_requests()))
    documented = sorted(set(doc_requests(stdlib_docs() if docs is None else docs)) - set(templated))
    requests = templated + documented
    found = overlap(requests, evaluation)
    bad = set(found.exact) | set(found.shared)
    kept = [r for i, r in enumerate(requests) if i not in bad]
    assert not overlap(kept, evaluation), "a request overlapping evaluation text survived the filter"
    order = np.random.default_rng(seed).permutation(len(kept))
    return RequestPool([kept[i] for i in order], len(templated), len(documented), [requests[i] for i in sorted(bad)])
