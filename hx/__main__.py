"""``python -m hx``: the same as the ``hx`` command."""

from hx.cli.main import main

main()
