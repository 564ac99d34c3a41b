"""The ``jobcontrol`` command: ``main`` parses and runs offline commands, ``online`` talks to
a running daemon over its admin API, ``output`` is the tables both print, ``demo`` the demo."""
