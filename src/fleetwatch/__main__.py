"""``python -m fleetwatch``: the same as the ``fleetwatch`` command."""

from fleetwatch.cli import main

main()
