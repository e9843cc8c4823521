"""Run N in-process reviews of one decision-path scenario, for counting instructions.

Wall-clock rates on a shared machine move by several per cent from run to run; the instructions
valgrind's callgrind counts do not. The per-review figure is the difference between two runs:

    for n in 0 500; do PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/count_reviews.py profiling $n 2>&1 | grep Collected; done

(total of the 500 run minus total of the 0 run) / 500 is the cost of one review, start-up and the
warm-up reviews cancelling out. Each review is decided anew (the decision cache off); ``--cached``
counts the same review answered from the cache instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from admission_bench import make_engine, scenarios

from kratos_admit.admission.cache import DEFAULT_SIZE
from kratos_admit.admission.engine import Webhook, review


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=["hints", "profiling", "denied-pod", "validate"])
    parser.add_argument("reviews", type=int, help="reviews after 20 warm-up ones")
    parser.add_argument("--cached", action="store_true", help="answered from the decision cache")
    args = parser.parse_args(argv)
    key = b"k" * 32
    scenario = next(s for s in scenarios(key) if s.name == args.scenario)
    engine = make_engine(key, cache=DEFAULT_SIZE if args.cached else 0)
    webhook: Webhook = "mutate" if scenario.path == "/mutate" else "validate"
    for _ in range(20 + args.reviews):
        answer = review(scenario.body, webhook=webhook, engine=engine)
    print(
        f"{args.reviews} {args.scenario} reviews after 20 warm-up ones, last {answer.outcome}, {len(answer.patch)} patch operations"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
