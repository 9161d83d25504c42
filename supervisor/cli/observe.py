"""`forkvisor web` and `forkvisor metrics`: the fleet seen from its queue folders.

Both need the `web` extra (`pip install "forkvisor[web]"`: prometheus_client); without
it they say so and exit 111, and nothing else of forkvisor needs it.

`forkvisor web` on TCP needs a token on every request for the queues' data, as Jupyter
does: loopback is open to every user of the host. The token is FORKVISOR_WEB_TOKEN, or
read from `--token-file`, or else made at each start, written where only its user may
read it, and printed once in the page's URL. It is never taken on the command line,
where every local user reads it (`ps`). `--no-token` serves without one, loudly.
`--socket PATH` serves on a Unix socket instead, where the kernel says who asks.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import stat
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jobs import Queue
from supervisor.cli.common import Commands, Parser, UsageError, add_command, positive_duration
from supervisor.errors import Unavailable

log = logging.getLogger(__name__)
DEFAULT_BIND = "127.0.0.1"
DEFAULT_PORT = 9810
TOKEN_FILE_LIMIT = 4096  # bytes read of --token-file: a token is one short line
NEW_TOKEN = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
NO_TOKEN_WARNING = (
    "serving WITHOUT A TOKEN (--no-token): every local user of this host%s can read every job's arguments, "
    "results, output and events of %s through it; drop --no-token to require the token"
)
WEB_EPILOG = """\
Every request for the queues' data needs a token (Authorization: Bearer TOKEN, or
?token=TOKEN, which the page keeps). It is FORKVISOR_WEB_TOKEN if set, or the first line
of --token-file PATH (a file others may not read). Else a new one is made at each start,
written (mode 0600, removed at exit) to web-PORT.token in a folder only you may write:
$RUNTIME_DIRECTORY (a systemd service's RuntimeDirectory=), else $XDG_RUNTIME_DIR/forkvisor,
else $XDG_STATE_HOME/forkvisor (~/.local/state/forkvisor); and the page's URL with it is
printed once. With --socket PATH, no token: each user sees only the queues they may read.
Exits 111 if it cannot listen, or cannot keep the token."""


def add_commands(commands: Commands[Parser]) -> None:
    web = add_command(commands, "web", _web, "serve a status page and /metrics for one or several queues")
    web.formatter_class = argparse.RawDescriptionHelpFormatter
    web.epilog = WEB_EPILOG
    web.add_argument("queues", nargs="+", type=Path, metavar="QUEUE")
    web.add_argument("--bind", metavar="ADDR", help=f"address to listen on ({DEFAULT_BIND})")
    web.add_argument("--port", type=int, help=f"port to listen on ({DEFAULT_PORT}; 0: any free)")
    web.add_argument("--token-file", type=Path, metavar="PATH", help="read the token from PATH, instead of making one")
    web.add_argument(
        "--no-token",
        action="store_true",
        help="serve without a token: every local user (and anyone who reaches --bind) then reads every job",
    )
    web.add_argument(
        "--socket",
        type=Path,
        metavar="PATH",
        help="listen on a Unix socket at PATH instead of TCP: no token, each user sees only the queues they may read",
    )
    web.add_argument("--token", help=argparse.SUPPRESS)  # refused, with the reason (see _check_web_options)
    web.set_defaults(log_default="INFO")

    metrics = add_command(commands, "metrics", _metrics, "print the queues' Prometheus metrics, or write a textfile")
    metrics.add_argument("queues", nargs="+", type=Path, metavar="QUEUE")
    metrics.add_argument(
        "--textfile", metavar="PATH", help="write them to PATH atomically (node_exporter's textfile collector)"
    )
    metrics.add_argument(
        "--every", type=positive_duration, metavar="DURATION", help="with --textfile: write again every DURATION"
    )


def _open(paths: list[Path]) -> list[Queue]:
    return [Queue(path, create=False) for path in paths]


def _needs_extra() -> Any:
    try:
        from supervisor import metrics, web  # here: prometheus_client is an optional extra
    except ModuleNotFoundError as exc:
        raise Unavailable(
            f"this command needs {exc.name}, which forkvisor's web extra installs: pip install 'forkvisor[web]'"
        ) from None
    return metrics, web


# -- forkvisor web ---------------------------------------------------------------------


def _web(args: argparse.Namespace) -> int:
    _, web = _needs_extra()
    _check_web_options(args)
    if args.socket is not None:
        _web_on_socket(web, _open(args.queues), args.socket)
    else:
        _web_on_tcp(web, args)
    return 0


def _check_web_options(args: argparse.Namespace) -> None:
    if args.token is not None:
        raise UsageError(
            "--token puts the token where every local user can read it (ps, /proc): write it to a file only you "
            "may read and give --token-file PATH, or set FORKVISOR_WEB_TOKEN"
        )
    if args.socket is not None:
        given = [name for name in ("bind", "port", "token_file") if getattr(args, name) is not None]
        given += ["no_token"] if args.no_token else []
        if given:
            names = ", ".join("--" + name.replace("_", "-") for name in given)
            raise UsageError(f"--socket serves on a Unix socket, where the kernel says who asks: drop {names}")
    elif args.no_token and (args.token_file is not None or os.environ.get("FORKVISOR_WEB_TOKEN")):
        raise UsageError("--no-token, yet a token is given (--token-file or FORKVISOR_WEB_TOKEN): choose one")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0 to 65535, got {args.port}")


def _web_on_tcp(web: Any, args: argparse.Namespace) -> None:
    bind, port = args.bind or DEFAULT_BIND, DEFAULT_PORT if args.port is None else args.port
    given = None if args.no_token else _given_token(args.token_file)
    queues = _open(args.queues)
    listener = _listen(lambda: web.listen_tcp(bind, port), f"{bind}:{port}")
    host, port = listener.getsockname()[:2]
    url = f"http://{'localhost' if web.is_loopback(host) else _url_host(host)}:{port}/"
    token, kept = None, None
    try:
        if args.no_token:
            reach = "" if web.is_loopback(bind) else f", and anyone who can reach {bind}:{port},"
            log.warning(NO_TOKEN_WARNING, reach, ", ".join(str(queue.path) for queue in queues))
        else:
            token = given or secrets.token_urlsafe(32)
            kept = None if given else _keep_token(token, port)
        web.serve(queues, listener, token, web.is_loopback(bind), lambda: _say_where(url, len(queues), token, kept))
    finally:
        listener.close()
        if kept is not None:
            _forget_token(*kept)


def _web_on_socket(web: Any, queues: list[Queue], path: Path) -> None:
    listener = _listen(lambda: web.listen_unix(path), str(path))

    def ready() -> None:
        log.info(
            "serving %d queue(s) on the Unix socket %s: each user sees only the queues they may read "
            "(curl --unix-socket %s http://localhost/api/overview; from afar, ssh -L 9810:%s HOST, "
            "then http://localhost:9810/)",
            len(queues),
            path,
            path,
            path,
        )
        print(path, flush=True)

    web.serve(queues, listener, None, True, ready)


def _listen(make: Any, where: str) -> Any:
    try:
        return make()
    except OSError as exc:
        raise Unavailable(f"cannot listen on {where}: {exc.strerror or exc}") from None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _say_where(url: str, count: int, token: str | None, kept: tuple[Path, int] | None) -> None:
    """The URL on stdout, with the token in it if we made it (`kept`: printed this once);
    in the log, where the token is kept, never the token itself."""
    if kept is None:
        log.info("serving %d queue(s) on %s (metrics at /metrics)", count, url)
        print(url, flush=True)
        return
    log.info(
        "serving %d queue(s) on %s (metrics at /metrics); the token is in %s: open the URL printed on "
        "stdout (it carries the token), or send Authorization: Bearer TOKEN",
        count,
        url,
        kept[0],
    )
    print(f"{url}?token={quote(token or '', safe='')}", flush=True)


# -- the token -------------------------------------------------------------------------


def _given_token(token_file: Path | None) -> str | None:
    """The token the operator gave (--token-file, or FORKVISOR_WEB_TOKEN), None if none."""
    from_environment = os.environ.get("FORKVISOR_WEB_TOKEN") or None
    if token_file is not None and from_environment is not None:
        raise UsageError("a token from --token-file and one from FORKVISOR_WEB_TOKEN: give one of them")
    if token_file is not None:
        return _checked(_read_token_file(token_file), f"--token-file {token_file}")
    if from_environment is not None:
        return _checked(from_environment.strip(), "FORKVISOR_WEB_TOKEN")
    return None


def _read_token_file(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # never blocks on a fifo
        try:
            info = os.fstat(fd)
            text = os.read(fd, TOKEN_FILE_LIMIT) if stat.S_ISREG(info.st_mode) else b""
        finally:
            os.close(fd)
    except OSError as exc:
        raise Unavailable(f"cannot read --token-file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise Unavailable(f"--token-file {path} is not a regular file")
    if info.st_mode & 0o004:
        raise Unavailable(
            f"--token-file {path} may be read by every user (mode {stat.S_IMODE(info.st_mode):04o}): chmod o-r {path}"
        )
    lines = text.decode("ascii", "replace").splitlines()
    return lines[0].strip() if lines else ""


def _checked(token: str, origin: str) -> str:
    from supervisor import web

    if not web.is_valid_token(token):
        raise UsageError(
            f"the token from {origin} must be 1 to 1024 letters, digits or -._~+/= (no spaces); make one with: "
            f"{NEW_TOKEN}"
        )
    return token


def token_folder() -> Path:
    """Where a made token is kept: a systemd service's RuntimeDirectory=, else the user's
    runtime folder (one of another user's, left by `su`, is passed over), else their state
    folder."""
    service = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if service:
        return Path(service)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and _is_mine(runtime):
        return Path(runtime) / "forkvisor"
    state = os.environ.get("XDG_STATE_HOME", "")
    return (Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state") / "forkvisor"


def _is_mine(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _keep_token(token: str, port: int) -> tuple[Path, int]:
    """Write the token to `web-PORT.token` in `token_folder()`, mode 0600; return its path
    and inode (to remove it at exit, if it is still ours)."""
    folder = token_folder()
    try:
        return _write_private(folder, f"web-{port}.token", f"{token}\n".encode())
    except OSError as exc:
        raise Unavailable(
            f"cannot keep the token in {folder}: {exc.strerror or exc}; give --token-file PATH, or set "
            "FORKVISOR_WEB_TOKEN"
        ) from None


def _write_private(folder: Path, name: str, data: bytes) -> tuple[Path, int]:
    """Write a new file only this user may read, in a folder only this user may write (made
    0700 if missing). The file is made with O_EXCL|O_NOFOLLOW: never one that was there,
    nor through a link; a file of that name (an earlier server on this port, killed) is
    replaced."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_private(folder, os.fstat(folder_fd))
        try:
            os.unlink(name, dir_fd=folder_fd)
        except FileNotFoundError:
            pass  # no earlier file: the usual case
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder_fd)
        try:
            os.fchmod(fd, 0o600)  # exactly, whatever the umask
            os.write(fd, data)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
    finally:
        os.close(folder_fd)
    return folder / name, inode


def _check_private(folder: Path, info: os.stat_result) -> None:
    if info.st_uid != os.geteuid():
        raise Unavailable(
            f"cannot keep the token in {folder}: it belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); "
            "give --token-file PATH, or set FORKVISOR_WEB_TOKEN"
        )
    if info.st_mode & 0o022:
        raise Unavailable(
            f"cannot keep the token in {folder}: others may write it (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"chmod go-w {folder}"
        )


def _forget_token(path: Path, inode: int) -> None:
    """Remove the token file at exit (the token dies with the server), if it is still ours."""
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass  # removed already


# -- forkvisor metrics -----------------------------------------------------------------


def _metrics(args: argparse.Namespace) -> int:
    metrics, _ = _needs_extra()
    if args.every is not None and args.textfile is None:
        raise UsageError("--every writes a textfile again and again: give --textfile too")
    queues = _open(args.queues)
    if args.textfile is None:
        sys.stdout.buffer.write(metrics.exposition(queues))
        return 0
    while True:
        try:
            metrics.write_textfile(queues, args.textfile)
        except OSError as exc:
            raise Unavailable(
                f"cannot write the textfile {args.textfile}: {exc.strerror or exc}; its folder must exist and be "
                "writable by you"
            ) from None
        if args.every is None:
            return 0
        time.sleep(args.every)  # a periodic export, not a wait for a condition
