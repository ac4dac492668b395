"""What the python-etcd3 scripts of this directory share: the deadline of every wait,
checks that fail with a message, the client connection, and the gRPC status behind an error.

The scripts run as `python3 -u tests/etcd3/<script>.py`, so this directory is on sys.path and
they import this module as `common`.
"""

import queue

import grpc

import etcd3

# How long any one wait may take (an event, a refresh, a thread, a watch being created).
DEADLINE = 20.0


class Failed(Exception):
    """A check that did not hold."""


def check(condition, message):
    if not condition:
        raise Failed(message)


def equal(actual, expected, what):
    check(actual == expected, "%s: expected %r, got %r" % (what, expected, actual))


def connect(endpoint):
    host, port = endpoint.rsplit(":", 1)
    # Every unary call, and the creation of each watch, gets this deadline.
    return etcd3.client(host=host, port=int(port), timeout=DEADLINE)


def take(q, what):
    """The next item of `q` within the deadline; an exception put there fails the check."""
    try:
        item = q.get(timeout=DEADLINE)
    except queue.Empty:
        raise Failed("nothing came within %.0f s: %s" % (DEADLINE, what))
    if isinstance(item, Exception):
        raise Failed("%s: the watch failed: %r" % (what, item))
    return item


def grpc_code(error):
    """The gRPC status code of `error` or of the error it was raised from (etcd3 translates some)."""
    while error is not None:
        if isinstance(error, grpc.RpcError):
            return error.code(), error.details()
        error = error.__context__
    return None, None


def described_failure(error):
    """`error` for a failure line: its message (or type), and its gRPC status if it has one."""
    code, details = grpc_code(error)
    extra = " (gRPC %s: %s)" % (code, details) if code is not None else ""
    return "%s%s" % (str(error) or type(error).__name__, extra)
