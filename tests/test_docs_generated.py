"""The docs' figures and examples are the code's (issue 60): each generated block of a page, and the
plot, against what docs/generate.py makes of the code now; and docs/reference.md's synopsis against
the argument parser. After a change that moves them: ``.venv/bin/python docs/generate.py``.

Cost: the cheap blocks (a review, two placements) take a second. The simulator's are checked through
one run of the example (seed 1, ~30 s on two CPUs), the run its table documents: that table as the
CLI prints it, the plot's legend (kept in the PNG's metadata, so no matplotlib is needed to read it),
and the seed 1 column of the five-seed table. The other four seeds are not rerun here (four more
runs, two minutes): a change to the code that moves them moves seed 1 too, so the suite still fails
and the generator rewrites all five."""

from __future__ import annotations

import argparse
import re

import pytest

from kratos_admit.cli.main import build_parser
from tests.harness import REPO, docs_generator

generate = docs_generator()


@pytest.mark.parametrize("block", generate.CHEAP_BLOCKS, ids=lambda b: b.name)
def test_each_example_in_the_docs_is_what_the_code_gives(block):
    assert generate.block_in(block.page, block.name) == block.make(), (
        f"{block.page}: block {block.name} differs from the code: run .venv/bin/python docs/generate.py"
    )


def test_the_readme_names_the_products_that_change_places_as_the_rankings_show():
    """The README's old "the other way round" was wrong: the block says which pairs swap, from the
    weights it shows."""
    text = generate.block_in("README.md", "readme-rankings")
    orders = [
        [w.rsplit(" ", 1)[0] for w in line.split(": ", 1)[1].split(", ")]
        for line in text.splitlines()
        if "-bound): " in line
    ]
    assert len(orders) == 2 and sorted(orders[0]) == sorted(orders[1])
    assert orders[0] != orders[1] and orders[0] != orders[1][::-1], "neither the same order nor reversed"


def test_the_simulator_figures_the_docs_show_are_a_run_of_the_code():
    from kratos_admit.simulation.report import plot_labels  # noqa: F401 (the legend the plot carries)

    table = generate.simulate_example()
    assert generate.block_in("docs/placement.md", "simulate-example") == table, (
        "docs/placement.md: the example's table differs from a run: run .venv/bin/python docs/generate.py"
    )
    means = {
        line.split()[0]: line.split()[1]
        for line in table.splitlines()[2:]
        if line
        and line.split()[0]
        in ("default", "kratos-static", "kratos-no-exploration", "kratos", "oracle", "oracle-wait")
    }
    assert generate.seed_one_column(generate.block_in("docs/placement.md", "simulate-seeds")) == means
    legend = generate.plot_description(generate.PLOT).splitlines()
    assert legend == [f"{name} (mean {int(seconds) / 60:.0f} min)" for name, seconds in means.items()], (
        "docs/placement-jct.png shows other figures than the table: run .venv/bin/python docs/generate.py"
    )


# --- docs/reference.md's synopsis and the parser agree ----------------------------------------------

FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def synopsis() -> dict[str, set[str]]:
    """Each command of the synopsis (``certs generate`` for a group's) and the flags it names."""
    text = (REPO / "docs" / "reference.md").read_text("utf-8")
    block = text.split("### Synopsis\n\n```\n", 1)[1].split("```", 1)[0]
    found: dict[str, set[str]] = {}
    command = ""
    for line in block.splitlines():
        if line.startswith("kratos-admit "):
            words = line.split()
            command = " ".join(w for w in words[1:3] if re.fullmatch(r"[a-z]+", w))
            if words[1] != "certs":
                command = words[1]
            found.setdefault(command, set())
        found[command] |= set(FLAG.findall(line.removeprefix(f"kratos-admit {command}")))
    return found


def parser_commands() -> dict[str, list[argparse.Action]]:
    """Each command of ``kratos-admit --help`` (a group's by its subcommands) and its options."""

    def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(sub.choices)

    found: dict[str, list[argparse.Action]] = {}
    for name, parser in subcommands(build_parser()).items():
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for full, p in (
            {f"{name} {n}": q for n, q in subcommands(parser).items()} if nested else {name: parser}
        ).items():
            found[full] = [a for a in p._actions if a.option_strings and a.dest != "help"]
    return found


def test_the_reference_synopsis_names_every_command_and_every_option_the_parser_has_and_no_other():
    documented, parsed = synopsis(), parser_commands()
    assert sorted(documented) == sorted(parsed)
    for command, actions in parsed.items():
        missing = [a.option_strings for a in actions if not set(a.option_strings) & documented[command]]
        known = {s for a in actions for s in a.option_strings}
        assert missing == [], f"kratos-admit {command}: options --help has and the synopsis lacks"
        assert sorted(documented[command] - known) == [], f"kratos-admit {command}: options --help lacks"
