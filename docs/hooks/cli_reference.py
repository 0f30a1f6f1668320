"""mkdocs hook: the CLI reference page is written from the real argparse parser at every build.

``docs/cli.md`` holds the marker ``<!-- cli-reference -->``; this hook replaces it with a table of the
commands and every command's ``--help``, exactly as ``tinydit COMMAND --help`` prints it. A flag added,
renamed or removed in ``tinydit.cli`` changes the page at the next build, so the page cannot go stale.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

MARKER = "<!-- cli-reference -->"
WIDTH = "100"  # argparse wraps help at the terminal's width: fix it, so every build writes the same page


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Each subcommand's name -> (its one-line help, its parser), in the order ``tinydit --help`` lists them."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {name: (helps.get(name, ""), sub) for name, sub in action.choices.items()}


def reference() -> str:
    """The markdown of the CLI reference, from ``tinydit.cli.build_parser()``."""
    os.environ["COLUMNS"] = WIDTH
    from tinydit.cli import build_parser  # imported at build time, from this checkout (on_config)

    parser = build_parser()
    home = str(Path.home())
    commands = subcommands(parser)
    lines = ["| command | what it does |", "|---|---|"]
    lines += [f"| [`tinydit {name}`](#tinydit-{name}) | {help_} |" for name, (help_, _) in commands.items()]
    lines += ["", "## tinydit", "", "```text", parser.format_help().rstrip(), "```"]
    for name, (help_, sub) in commands.items():
        text = sub.format_help().replace(home, "~").rstrip()  # defaults under the builder's home, as ~
        lines += ["", f"## tinydit {name}", "", help_[:1].upper() + help_[1:] + ".", "", "```text", text, "```"]
    return "\n".join(lines) + "\n"


def on_config(config):
    """Read the parser of this checkout (``src/`` beside mkdocs.yml), wherever tinydit is installed from."""
    src = str(Path(config.config_file_path).parent / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())
