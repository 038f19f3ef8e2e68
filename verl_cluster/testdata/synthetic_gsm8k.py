"""Synthetic grade-school word problems in the openai/gsm8k row format ({question, answer}).

For machines that cannot download GSM8K: the rows go through the same convert_rows/write_parquet path as
the real data. Answers are written the GSM8K way: one reasoning line per step with a calculator note
`<<expr=value>>`, then `#### <number>`. Every number is a non-negative integer, so verl's exact-match
reward (verl.utils.reward_score.gsm8k) can score them. Pure Python: the same seed gives the same rows.
"""

from __future__ import annotations

import random
from typing import Callable

from verl_cluster.errors import ConfigError

NAMES = ["Ava", "Ben", "Carla", "Deepak", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi", "Lena",
         "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wei", "Yusuf", "Zoe",
         "Amara", "Bruno", "Chloe", "Diego", "Emily", "Felix", "Hannah", "Isaac", "Julia", "Kenji", "Lucas",
         "Maya", "Noah", "Olivia", "Pablo", "Ruth", "Sofia", "Theo", "Victor", "Willow", "Xavier", "Yara"]
ITEMS = ["apple", "pencil", "cookie", "marble", "sticker", "notebook", "cupcake", "orange", "book", "toy car",
         "balloon", "muffin", "shell", "card", "bead", "egg", "candle", "plant", "ticket", "brick", "banana",
         "sandwich", "crayon", "eraser", "puzzle", "comic", "bracelet", "necklace", "flower", "pillow", "towel",
         "lemon", "peach", "bottle", "jar of honey", "loaf of bread", "kite", "feather", "button", "stamp"]
PLACES = ["bakery", "shop", "farm stand", "school fair", "market", "library sale", "toy store", "garden center",
          "grocery store", "flower shop", "craft fair", "bookstore", "cafe", "street stall"]
THINGS = ["a bike", "a jacket", "a pair of shoes", "a video game", "a backpack", "a gift", "a lamp", "a watch",
          "a guitar", "a helmet", "a skateboard", "a camera", "a blanket", "a puzzle box", "concert tickets"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


class Steps:
    """Collects reasoning lines; `calc` returns the value so templates chain steps."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def calc(self, text: str, expr: str, value: int) -> int:
        # the generator's own arithmetic is the truth; the note must agree with it (tests re-evaluate it)
        self.lines.append(f"{text} {expr} = <<{expr}={value}>>{value}.")
        return value

    def answer(self, result: int) -> str:
        return "\n".join(self.lines + [f"#### {result}"])


def _buy(rng: random.Random) -> tuple[str, str, int]:
    name, (a_item, b_item) = rng.choice(NAMES), rng.sample(ITEMS, 2)
    a, p, b, q = rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 12), rng.randint(1, 9)
    s = Steps()
    x = s.calc(f"The {a_item}s cost", f"{a}*{p}", a * p)
    y = s.calc(f"The {b_item}s cost", f"{b}*{q}", b * q)
    total = s.calc(f"{name} spends", f"{x}+{y}", x + y)
    question = (f"{name} buys {a} {a_item}s for ${p} each and {b} {b_item}s for ${q} each. "
                f"How many dollars does {name} spend in all?")
    return question, s.answer(total), total


def _sold(rng: random.Random) -> tuple[str, str, int]:
    name, item, place = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(PLACES)
    day1, day2 = rng.sample(DAYS, 2)
    b, k = rng.randint(3, 30), rng.randint(2, 4)
    start = rng.randint(b * (k + 1), b * (k + 1) + 60)
    s = Steps()
    second = s.calc(f"On {day2} the {place} sold", f"{b}*{k}", b * k)
    sold = s.calc("In total it sold", f"{b}+{second}", b + second)
    left = s.calc("The number left is", f"{start}-{sold}", start - sold)
    times = {2: "twice", 3: "three times", 4: "four times"}[k]
    question = (f"{name}'s {place} had {start} {item}s. It sold {b} on {day1} and {times} as many on {day2}. "
                f"How many {item}s are left?")
    return question, s.answer(left), left


def _share(rng: random.Random) -> tuple[str, str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each = rng.randint(2, 8), rng.randint(2, 15)
    per_box = rng.choice([d for d in range(2, 13) if (friends * each) % d == 0] or [1])
    boxes = friends * each // per_box
    s = Steps()
    total = s.calc(f"{name} has", f"{boxes}*{per_box}", boxes * per_box)
    share = s.calc("Each friend gets", f"{total}/{friends}", total // friends)
    question = (f"{name} has {boxes} boxes of {item}s with {per_box} {item}s in each box. {name} shares them "
                f"equally among {friends} friends. How many {item}s does each friend get?")
    return question, s.answer(share), share


def _wages(rng: random.Random) -> tuple[str, str, int]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    rate, hours, days = rng.randint(8, 25), rng.randint(2, 8), rng.randint(2, 6)
    s = Steps()
    daily = s.calc(f"{name} earns per day", f"{rate}*{hours}", rate * hours)
    total = s.calc(f"Over {days} days {name} earns", f"{daily}*{days}", daily * days)
    cost = rng.randint(10, total)
    left = s.calc(f"After buying {thing}, {name} has", f"{total}-{cost}", total - cost)
    question = (f"{name} earns ${rate} an hour and works {hours} hours a day for {days} days. Then {name} "
                f"spends ${cost} on {thing}. How many dollars does {name} have left?")
    return question, s.answer(left), left


def _percent(rng: random.Random) -> tuple[str, str, int]:
    item, place = rng.choice(ITEMS), rng.choice(PLACES)
    n, pct = 10 * rng.randint(5, 60), rng.choice([10, 20, 30, 40, 50])
    morning = n * pct // 100
    later = rng.randint(0, n - morning)
    s = Steps()
    m = s.calc("In the morning it sold", f"{n}*{pct}/100", morning)
    sold = s.calc("In all it sold", f"{m}+{later}", m + later)
    left = s.calc("The number left is", f"{n}-{sold}", n - sold)
    question = (f"A {place} has {n} {item}s. It sells {pct}% of them in the morning and {later} more in the "
                f"afternoon. How many {item}s are left at the end of the day?")
    return question, s.answer(left), left


def _compare(rng: random.Random) -> tuple[str, str, int]:
    a, b, c = rng.sample(NAMES, 3)
    item = rng.choice(ITEMS)
    x, more = rng.randint(3, 40), rng.randint(1, 30)
    if (x + more) % 2:
        more += 1
    s = Steps()
    bb = s.calc(f"{b} has", f"{x}+{more}", x + more)
    cc = s.calc(f"{c} has", f"{bb}/2", bb // 2)
    total = s.calc("Together they have", f"{x}+{bb}+{cc}", x + bb + cc)
    question = (f"{a} has {x} {item}s. {b} has {more} more {item}s than {a}, and {c} has half as many as {b}. "
                f"How many {item}s do they have together?")
    return question, s.answer(total), total


def _travel(rng: random.Random) -> tuple[str, str, int]:
    name = rng.choice(NAMES)
    vehicle = rng.choice(["bus", "train", "car", "bicycle", "ferry", "truck"])
    v1, h1, v2, h2 = rng.randint(10, 70), rng.randint(2, 5), rng.randint(10, 70), rng.randint(2, 5)
    s = Steps()
    d1 = s.calc("The first part of the journey is", f"{v1}*{h1}", v1 * h1)
    d2 = s.calc("The second part of the journey is", f"{v2}*{h2}", v2 * h2)
    total = s.calc("The whole journey is", f"{d1}+{d2}", d1 + d2)
    question = (f"{name} travels by {vehicle} at {v1} miles per hour for {h1} hours, then at {v2} miles per "
                f"hour for {h2} hours. How many miles does {name} travel altogether?")
    return question, s.answer(total), total


def _bake(rng: random.Random) -> tuple[str, str, int]:
    name = rng.choice(NAMES)
    treat = rng.choice(["pancakes", "brownies", "waffles", "pies", "cakes", "scones", "biscuits"])
    batches, cups = rng.randint(2, 9), rng.randint(2, 6)
    bag = rng.randint(batches * cups, batches * cups + 40)
    s = Steps()
    used = s.calc(f"{name} uses", f"{batches}*{cups}", batches * cups)
    left = s.calc("The flour left is", f"{bag}-{used}", bag - used)
    question = (f"{name} has a bag with {bag} cups of flour. Each batch of {treat} needs {cups} cups of flour, "
                f"and {name} bakes {batches} batches for a party. How many cups of flour remain in the bag?")
    return question, s.answer(left), left


def _garden(rng: random.Random) -> tuple[str, str, int]:
    name = rng.choice(NAMES)
    crop = rng.choice(["tomato", "carrot", "lettuce", "pepper", "pumpkin", "strawberry", "cabbage", "bean"])
    rows, eaten = rng.randint(3, 15), rng.randint(2, 5)
    per_row = eaten * rng.randint(2, 6)  # a whole number of plants is eaten
    s = Steps()
    planted = s.calc(f"{name} planted", f"{rows}*{per_row}", rows * per_row)
    lost = s.calc("The rabbits ate", f"{planted}/{eaten}", planted // eaten)
    left = s.calc("The plants still growing are", f"{planted}-{lost}", planted - lost)
    question = (f"{name} plants {rows} rows of {crop} plants with {per_row} plants in each row. Rabbits eat "
                f"1/{eaten} of the plants. How many {crop} plants are still growing?")
    return question, s.answer(left), left


TEMPLATES: list[Callable[[random.Random], tuple[str, str, int]]] = [
    _buy, _sold, _share, _wages, _percent, _compare, _travel, _bake, _garden]


def make_problem(rng: random.Random) -> dict:
    """One row: question, answer (GSM8K style) and `result`, the integer the answer must end with."""
    question, answer, result = rng.choice(TEMPLATES)(rng)
    return {"question": question, "answer": answer, "result": result}


def synthetic_splits(train_rows: int, test_rows: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Train and test rows with no question in both (a repeat would leak the test answer into training)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[dict] = []
    tries = 0
    while len(rows) < train_rows + test_rows:
        tries += 1
        if tries > 20 * (train_rows + test_rows) + 1000:
            raise ConfigError(f"cannot make {train_rows + test_rows} distinct problems", "ask for fewer rows")
        row = make_problem(rng)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows[:train_rows], rows[train_rows:]
