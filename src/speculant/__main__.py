"""The ``speculant`` console script and ``python -m speculant``: an interrupt (Ctrl-C) at any
moment, during the start-up imports as much as in a command, exits 130 with one line on stderr.

During the imports an interrupt must not become a ``KeyboardInterrupt``: raised inside a C
extension's initialization (numpy's, ONNX Runtime's) it comes out as an ``ImportError``. Until
they are done, SIGINT therefore ends the process at once (nothing is written or started yet);
then a command sees the usual ``KeyboardInterrupt``, so its ``finally`` blocks run. Neither this
module nor ``speculant/__init__`` imports anything heavy, so the handler comes first."""

import contextlib
import os
import signal
import sys

INTERRUPTED = 130  # 128 + SIGINT, the shell's convention (typer exits with it too)


def main() -> None:
    is_default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if is_default:  # an ignored SIGINT (a background job) stays ignored
        signal.signal(signal.SIGINT, _leave_during_imports)
    import speculant.engine  # noqa: F401 - what every model command imports
    from speculant.cli import full_app
    from speculant.cli import main as run_command
    full_app()  # the plugins' commands, imported once
    if is_default:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run_command()
    except KeyboardInterrupt:
        _interrupted()
    except SystemExit as exit_:
        if exit_.code == INTERRUPTED:  # typer's answer to an interrupt inside a command
            _interrupted()
        raise


def _leave_during_imports(signum: int, frame: object) -> None:
    os.write(2, b"interrupted\n")
    os._exit(INTERRUPTED)


def _interrupted() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the line
    with contextlib.suppress(OSError, ValueError):  # a closed or broken stdout
        sys.stdout.flush()
    print("interrupted", file=sys.stderr)
    raise SystemExit(INTERRUPTED) from None


if __name__ == "__main__":
    main()
