"""The headless command line: ``python main.py <command>`` and the ``ampscope`` script.

``parser`` builds the parser and runs ``main``; each command has the module named as it
is (``profile``, ``plan``, ``trace``...), holding its ``add_parser(sub)`` and its handler
``run(args)``. No other module of the engine, the window or the public API parses
arguments.
"""

from engine.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
