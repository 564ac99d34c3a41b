"""``jobcontrol-admin``: open the admin client on a daemon.

With a URL and a token found (``--url``/``--token``, ``$JOBCONTROL_URL``/
``$JOBCONTROL_TOKEN``, or the local daemon's URL file and token file) it
connects at once; otherwise, or with ``--ask``, it opens the connection dialog.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from pathlib import Path

from jobcontrol.client.locate import daemon_url, token_option_warning

# What to say when Qt is not installed (the entry point is installed with or without it).
NO_QT = (
    "jobcontrol-admin: the admin client needs Qt (PySide6), which comes with the gui "
    "extra: pip install 'jobcontrol[gui]'"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jobcontrol-admin", description="The Job Control admin client (Qt)."
    )
    p.add_argument("--url", help="the daemon's URL (env JOBCONTROL_URL; default: the local daemon)")
    p.add_argument("--token", help="an API token (env JOBCONTROL_TOKEN; default: the token file)")
    p.add_argument("--db", help="find the local daemon of this database (env JOBCONTROL_DB)")
    p.add_argument("--state-dir", type=Path, default=None, help="the daemon's state directory")
    p.add_argument("--ask", action="store_true", help="always open the connection dialog")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.token:
        sys.stderr.write(f"jobcontrol-admin: {token_option_warning(args.db)}\n")
    try:
        import PySide6.QtWidgets  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "PySide6":
            raise
        sys.stderr.write(NO_QT + "\n")
        return 1
    except ImportError as exc:  # there, but it cannot load (a missing system library)
        sys.stderr.write(f"jobcontrol-admin: cannot load Qt (PySide6): {exc}\n")
        return 1
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from PySide6.QtWidgets import QApplication

    from jobcontrol_admin.connection import find
    from jobcontrol_admin.session import Session
    from jobcontrol_admin.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Job Control")
    app.setOrganizationName("jobcontrol")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C in the terminal closes it
    window = MainWindow()
    window.show()
    found = find(args.url, args.token, args.db, args.state_dir)
    if found.url and found.token and not args.ask:
        if found.url_source.startswith("the daemon's URL file"):
            window.rediscover = functools.partial(daemon_url, args.db, args.state_dir)
        window.connect_to(Session(found.url, found.token))
    else:
        window.open_connection_dialog(found)
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main())
