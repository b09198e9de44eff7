"""Rule generation + promtool check, for the default spec and a 200-SLO spec.

Baseline: `promtool check rules` alone on the same file, the floor any generator pays to be
checked. Prints seconds, rules/s and the end-to-end ratio over that floor. Target: default spec
end to end < 2 s.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.figures import Figure, below, exit_code, info
from redline.generate.outputs import RULE_FILE, RULES_DIR, build_outputs, write_outputs
from redline.rules.build import build_rule_groups
from redline.slo.load import load_spec
from redline.slo.spec import ErrorsSli, Slo, SlowRequestsSli, Spec


def spec_with_slos(count: int) -> Spec:
    """The default spec with `count` SLOs, alternating latency and availability per model."""
    base = load_spec().spec
    slos = tuple(
        Slo(
            name=f"tenant_{i}",
            objective=0.99 if i % 2 else 0.999,
            sli=SlowRequestsSli(threshold_seconds=0.8, selector={"model": f"m{i}"})
            if i % 2
            else ErrorsSli(selector={"model": f"m{i}"}),
        )
        for i in range(count)
    )
    return base.model_copy(update={"slos": slos})


def _promtool_check(directory: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["promtool", "check", "rules", RULE_FILE], cwd=directory, check=True,
                   capture_output=True)  # fmt: skip
    return time.perf_counter() - started


def measure(name: str, spec: Spec, repeat: int = 3) -> dict[str, float | str]:
    """Best-of-`repeat` timings of generation, promtool check, and both."""
    rules = sum(len(g.rules) for g in build_rule_groups(spec))
    best_gen = best_check = float("inf")
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            write_outputs(Path(tmp), build_outputs(spec, "bench.yaml"))
            gen = time.perf_counter() - started
            check = _promtool_check(Path(tmp) / RULES_DIR)
        best_gen, best_check = min(best_gen, gen), min(best_check, check)
    total = best_gen + best_check
    return {
        "spec": name,
        "rules": rules,
        "generate_s": best_gen,
        "promtool_s": best_check,
        "end_to_end_s": total,
        "rules_per_s": rules / total,
        "ratio_vs_promtool": total / best_check,
    }


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run both specs, print the table; the figures."""
    rows = [measure("default", load_spec().spec), measure("200 SLOs", spec_with_slos(200))]
    header = f"{'spec':<10} {'rules':>6} {'generate s':>11} {'promtool s':>11} {'total s':>8} "
    print(header + f"{'rules/s':>9} {'total/promtool':>15}")
    for r in rows:
        print(
            f"{r['spec']:<10} {r['rules']:>6} {r['generate_s']:>11.3f} {r['promtool_s']:>11.3f} "
            f"{r['end_to_end_s']:>8.3f} {r['rules_per_s']:>9.0f} {r['ratio_vs_promtool']:>14.2f}x"
        )
    default_total = float(rows[0]["end_to_end_s"])
    verdict = "met" if default_total < 2 else "MISSED"
    print(f"target: default spec end to end < 2 s: {default_total:.3f} s ({verdict})")
    big = rows[1]
    return [
        below("generate", "default spec, generate + promtool", default_total, "s", 2.0),
        info("generate", "200-SLO spec, generate + promtool", float(big["end_to_end_s"]), "s"),
        info("generate", "200-SLO spec, rules/s end to end", float(big["rules_per_s"]), "rules/s"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
